//! PostgreSQL least privilege (issue 13 point 4): a migrated database matches the grants
//! table in docs/review.md exactly, and each role — runtime, admin, owner — is refused every
//! statement the contract forbids it, each refusal checked by SQLSTATE and message. Also: a
//! database migrated by version 1 (runtime role with INSERT everywhere) is fixed by one
//! re-run of `migrate`.

use crate::review_support::{PgDb, StoreSel, token_for, user_with_token};
use crate::support::World;
use std::collections::{BTreeMap, BTreeSet};
use tokio_postgres::{Client, NoTls};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

async fn pg(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// Runs `sql` and asserts it fails with SQLSTATE `code` and a message containing `msg`.
async fn refused(c: &Client, sql: &str, code: &str, msg: &str) {
    let e = match c.batch_execute(sql).await {
        Ok(()) => panic!("allowed, must be refused: {sql}"),
        Err(e) => e,
    };
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: not a database error: {e}"));
    assert_eq!(db.code().code(), code, "{sql}: {}", db.message());
    assert!(db.message().contains(msg), "{sql}: {:?} lacks {msg:?}", db.message());
}

/// `42501` with the standard "permission denied" message.
async fn denied(c: &Client, sql: &str) {
    refused(c, sql, "42501", "permission denied").await;
}

/// `42501` raised by the insert-only triggers.
async fn insert_only(c: &Client, sql: &str) {
    refused(c, sql, "42501", "insert-only").await;
}

async fn one(c: &Client, sql: &str) -> String {
    let rows = c.simple_query(sql).await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default()
}

fn flag_call(secret: Option<&str>, flag: &str, state: &str, over: bool) -> String {
    let secret = secret.map_or("NULL".to_string(), |s| format!("'{s}'"));
    format!("SELECT * FROM airlock_flag_state({secret}, '{flag}', '{state}', NULL, {over})")
}

/// `airlock_flag_assign` (migration 9): `assignee` a user id or `None` (unassign).
fn assign_call(secret: Option<&str>, flag: &str, assignee: Option<&str>, over: bool) -> String {
    let q = |v: Option<&str>| v.map_or("NULL".to_string(), |s| format!("'{s}'"));
    format!(
        "SELECT * FROM airlock_flag_assign({}, '{flag}', {}, NULL, {over})",
        q(secret),
        q(assignee)
    )
}

/// The grants table of docs/review.md: object → (admin privileges, runtime privileges).
fn documented_grants() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/review.md"),
    )
    .unwrap();
    let section = doc.split("### Grants (the contract)").nth(1).expect("grants section");
    let section = section.split("\n## ").next().unwrap();
    let privs = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty() && p != "—")
            .collect()
    };
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", object, owner, admin, runtime, holds, ""]
        let name = cells[1].split('`').nth(1).unwrap().to_string();
        out.insert(name, (privs(cells[3]), privs(cells[4])));
    }
    assert!(out.len() >= 10, "grants table not found or too short: {out:?}");
    out
}

/// What `role` actually holds on each documented object (and on any other table).
async fn actual_grants(owner: &Client, role: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in owner
        .query(
            "SELECT table_name::text, privilege_type::text FROM information_schema.role_table_grants
             WHERE grantee = $1",
            &[&role],
        )
        .await
        .unwrap()
    {
        out.entry(r.get(0)).or_default().insert(r.get(1));
    }
    for r in owner
        .query(
            "SELECT c.relname::text, p.priv FROM pg_class c
             CROSS JOIN unnest(ARRAY['USAGE','SELECT','UPDATE']) AS p(priv)
             WHERE c.relkind = 'S' AND c.relnamespace = current_schema()::regnamespace
               AND has_sequence_privilege($1, c.oid, p.priv)",
            &[&role],
        )
        .await
        .unwrap()
    {
        out.entry(r.get(0)).or_default().insert(r.get(1));
    }
    for r in owner
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.prorettype <> 'trigger'::regtype
               AND has_function_privilege($1, p.oid, 'EXECUTE')",
            &[&role],
        )
        .await
        .unwrap()
    {
        let sig: String = r.get(0);
        out.entry(sig.replace(',', ", ").replace(",  ", ", ")).or_default().insert("EXECUTE".into());
    }
    out
}

/// The database holds exactly what the docs' table grants each role — nothing on partitions,
/// nothing on tables the table does not list — and every table has a row.
async fn grants_match_the_docs(owner: &Client, runtime: &str, admin: &str) {
    let doc = documented_grants();
    for (role, pick) in [(runtime, 1), (admin, 0)] {
        let actual = actual_grants(owner, role).await;
        for (obj, privs) in &actual {
            let want = doc.get(obj).unwrap_or_else(|| {
                panic!("{role} holds {privs:?} on {obj}, which the grants table does not list")
            });
            let want = if pick == 1 { &want.1 } else { &want.0 };
            assert_eq!(privs, want, "{role} on {obj}");
        }
        for (obj, (a, r)) in &doc {
            let want = if pick == 1 { r } else { a };
            if !want.is_empty() {
                assert!(actual.contains_key(obj), "{role} lacks {want:?} on {obj}");
            }
        }
    }
    // Every table of the store (partitions aside) has its row.
    for r in owner
        .query(
            "SELECT relname::text FROM pg_class WHERE relnamespace = current_schema()::regnamespace
             AND relkind IN ('r', 'p') AND NOT relispartition",
            &[],
        )
        .await
        .unwrap()
    {
        let t: String = r.get(0);
        assert!(doc.contains_key(&t), "table {t} has no row in the grants table of docs/review.md");
    }
}

#[test]
fn pg_roles_hold_exactly_the_documented_grants_and_are_refused_the_rest() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let _ana = user_with_token(&world, &store, "ana@example.test", "member");
    let ana2 = token_for(&world, &store, "ana@example.test");
    let rev_old = user_with_token(&world, &store, "rev@example.test", "reviewer");
    world
        .airlockd(world.tmp.path())
        .args(["admin", "token", "revoke", "--user", "rev@example.test"])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    let rev = token_for(&world, &store, "rev@example.test");
    let adm = user_with_token(&world, &store, "adm@example.test", "admin");
    rt().block_on(async {
        let owner = pg(&db.owner_url).await;
        let runtime = pg(&db.runtime_url).await;
        let admin = pg(&db.admin_url).await;
        grants_match_the_docs(&owner, &db.role, &db.admin_role).await;
        let id = "SELECT id FROM users WHERE email = ";
        let ana_id = one(&owner, &format!("{id} 'ana@example.test'")).await;
        let rev_id = one(&owner, &format!("{id} 'rev@example.test'")).await;
        let adm_id = one(&owner, &format!("{id} 'adm@example.test'")).await;

        // --- The runtime role: inserts events, keys and flags; nothing else is writable. ---
        runtime
            .batch_execute(&format!(
                "INSERT INTO events (pk, user_id, source, id, type, ts, payload)
                   VALUES (nextval('events_pk_seq'), '{ana_id}', 'egress', 'ok-1', 'connect', 0, '{{}}');
                 INSERT INTO flags (id, rule_id, title, severity, user_id, detail)
                   VALUES ('f-ana', 'r', 't', 'high', '{ana_id}', 'd'), ('f-adm', 'r', 't', 'high', '{adm_id}', 'd'),
                          ('f-rev', 'r', 't', 'high', '{rev_id}', 'd');"
            ))
            .await
            .unwrap();
        for sql in [
            "UPDATE events SET payload = '{}'".to_string(),
            "DELETE FROM events".into(),
            "TRUNCATE events".into(),
            "TRUNCATE events_default".into(),
            "INSERT INTO events_default (pk, user_id, source, id, type, ts, payload) VALUES (1, 'u', 'egress', 'p', 't', 0, '{}')".into(),
            "UPDATE event_keys SET pk = 0".into(),
            "INSERT INTO users (id, email) VALUES ('evil', 'evil@example.test')".into(),
            format!("INSERT INTO tokens (id, user_id, hash) VALUES ('evil', '{ana_id}', sha256('alk_evil'))"),
            "INSERT INTO token_revocations (token_id) SELECT id FROM tokens LIMIT 1".into(),
            format!("INSERT INTO user_roles (user_id, role) VALUES ('{ana_id}', 'admin')"),
            "UPDATE user_roles SET role = 'admin'".into(),
            format!("INSERT INTO flag_states (flag_id, state, actor, at) VALUES ('f-ana', 'dismissed', '{rev_id}', now())"),
            "INSERT INTO schema_migrations (version) VALUES (999)".into(),
            "SELECT setval('events_pk_seq', 1)".into(),
            "SELECT nextval('user_roles_n_seq')".into(),
            "CREATE TABLE evil (x int)".into(),
            "CREATE FUNCTION sha256(text) RETURNS bytea LANGUAGE sql AS 'SELECT NULL::bytea'".into(),
        ] {
            denied(&runtime, &sql).await;
        }
        refused(&runtime, "ALTER TABLE events DISABLE TRIGGER ALL", "42501", "must be owner").await;
        // A backdated (or any supplied) received_at / created_at is refused by trigger.
        for sql in [
            format!("INSERT INTO events (pk, user_id, source, id, type, ts, received_at, payload)
               VALUES (nextval('events_pk_seq'), '{ana_id}', 'egress', 'bd', 'connect', 0, now() - interval '30 days', '{{}}')"),
            format!("INSERT INTO event_keys (user_id, source, id, pk, received_at)
               VALUES ('{ana_id}', 'egress', 'bd', 1, '2020-01-01')"),
            format!("INSERT INTO flags (id, rule_id, title, severity, user_id, detail, created_at)
               VALUES ('f-bd', 'r', 't', 'high', '{ana_id}', 'd', '2020-01-01')"),
        ] {
            refused(&runtime, &sql, "42501", "set by the database").await;
        }
        // Flag states only through the function, which checks the token itself.
        refused(&runtime, &flag_call(None, "f-ana", "dismissed", false), "AL401", "no credential").await;
        refused(&runtime, &flag_call(Some(""), "f-ana", "dismissed", false), "AL401", "no credential").await;
        refused(&runtime, &flag_call(Some("alk_unknown"), "f-ana", "dismissed", false), "AL401", "invalid or revoked").await;
        refused(&runtime, &flag_call(Some(&rev_old), "f-ana", "dismissed", false), "AL401", "invalid or revoked").await;
        refused(&runtime, &flag_call(Some(&ana2), "f-ana", "dismissed", false), "AL403", "only reviewers and admins").await;
        // Override is an admin's: a reviewer's grants nothing on their own history.
        refused(&runtime, &flag_call(Some(&rev), "f-rev", "dismissed", true), "AL403", "your own history").await;
        // Two reviewers/admins exist: the admin may not act on a flag on their own history…
        refused(&runtime, &flag_call(Some(&adm), "f-adm", "dismissed", false), "AL403", "your own history").await;
        // …except by override, marked self; a reviewer's action records the reviewer.
        runtime.batch_execute(&flag_call(Some(&adm), "f-adm", "dismissed", true)).await.unwrap();
        runtime.batch_execute(&flag_call(Some(&rev), "f-ana", "acknowledged", false)).await.unwrap();
        assert_eq!(
            one(&owner, "SELECT string_agg(flag_id || ':' || actor || ':' || self, ',' ORDER BY n) FROM flag_states").await,
            format!("f-adm:{adm_id}:true,f-ana:{rev_id}:false")
        );
        // An unknown flag: no row, nothing written.
        assert_eq!(one(&runtime, &format!("SELECT count(*) FROM ({}) x", flag_call(Some(&rev), "nope", "resolved", false))).await, "0");

        // Assignments only through `airlock_flag_assign`: the same credential, role and self
        // checks, and an assignee who exists and is a reviewer or admin.
        denied(&runtime, &format!("INSERT INTO flag_states (flag_id, state, actor, at, assignment, assignee) VALUES ('f-ana', 'open', '{rev_id}', now(), true, '{rev_id}')")).await;
        refused(&runtime, &assign_call(None, "f-ana", Some(&rev_id), false), "AL401", "no credential").await;
        refused(&runtime, &assign_call(Some(&rev_old), "f-ana", Some(&rev_id), false), "AL401", "invalid or revoked").await;
        refused(&runtime, &assign_call(Some(&ana2), "f-ana", Some(&rev_id), false), "AL403", "only reviewers and admins").await;
        refused(&runtime, &assign_call(Some(&rev), "f-rev", Some(&adm_id), true), "AL403", "your own history").await;
        refused(&runtime, &assign_call(Some(&adm), "f-adm", Some(&rev_id), false), "AL403", "your own history").await;
        refused(&runtime, &assign_call(Some(&rev), "f-ana", Some("ghost"), false), "AL400", "no user with id ghost").await;
        refused(&runtime, &assign_call(Some(&rev), "f-ana", Some(&ana_id), false), "AL400", "only reviewers and admins can be assigned").await;
        assert_eq!(one(&runtime, &format!("SELECT count(*) FROM ({}) x", assign_call(Some(&rev), "nope", Some(&adm_id), false))).await, "0");
        // Accepted: the row keeps the flag's state (f-ana is acknowledged) and names the
        // assignee; unassigning names nobody.
        runtime.batch_execute(&assign_call(Some(&rev), "f-ana", Some(&adm_id), false)).await.unwrap();
        runtime.batch_execute(&assign_call(Some(&adm), "f-adm", None, true)).await.unwrap();
        assert_eq!(
            one(&owner, "SELECT string_agg(flag_id || ':' || state || ':' || actor || ':' || self || ':' || assignment || ':' || coalesce(assignee, '-'), ',' ORDER BY n) FROM flag_states WHERE assignment").await,
            format!("f-ana:acknowledged:{rev_id}:false:true:{adm_id},f-adm:dismissed:{adm_id}:true:true:-")
        );

        // --- Action gates (migration 0011): the runtime role opens gates; decisions only
        // through `airlock_gate_decide`, which checks the credential and the gate rule. ---
        let gate = |id: &str, owner: &str, severity: &str| {
            format!(
                "INSERT INTO gates (id, user_id, kind, action, digest, severity, timeout_ms)
                 VALUES ('{id}', '{owner}', 'external', 'a-{id}',
                         'sha256:' || encode(sha256(convert_to('a-{id}', 'UTF8')), 'hex'), '{severity}', 60000)"
            )
        };
        runtime.batch_execute(&gate("g-ana", &ana_id, "medium")).await.unwrap();
        runtime.batch_execute(&gate("g-rev", &rev_id, "medium")).await.unwrap();
        runtime.batch_execute(&gate("g-high", &ana_id, "high")).await.unwrap();
        runtime.batch_execute(&gate("g-adm", &adm_id, "medium")).await.unwrap();
        refused(
            &runtime,
            &format!("INSERT INTO gates (id, user_id, kind, action, digest, severity, timeout_ms)
               VALUES ('g-bad', '{ana_id}', 'external', 'one thing', 'sha256:00', 'low', 60000)"),
            "23514",
            "SHA-256 of its action",
        )
        .await;
        refused(
            &runtime,
            &format!("INSERT INTO gates (id, user_id, kind, action, digest, severity, timeout_ms, requested_at)
               VALUES ('g-bd', '{ana_id}', 'external', 'x', 'sha256:' || encode(sha256('x'), 'hex'), 'low', 60000, now() - interval '1 day')"),
            "42501",
            "set by the database",
        )
        .await;
        for sql in [
            "UPDATE gates SET severity = 'low'".to_string(),
            "DELETE FROM gates".into(),
            format!("INSERT INTO gate_decisions (gate_id, state, actor) VALUES ('g-ana', 'approved', '{rev_id}')"),
            "SELECT * FROM airlock_credential('x')".into(),
        ] {
            denied(&runtime, &sql).await;
        }
        let decide = |secret: Option<&str>, g: &str, state: &str, over: bool, step: bool| {
            let secret = secret.map_or("NULL".to_string(), |s| format!("'{s}'"));
            format!("SELECT outcome FROM airlock_gate_decide({secret}, '{g}', '{state}', 'n', NULL, {over}, {step})")
        };
        refused(&runtime, &decide(None, "g-ana", "approved", false, false), "AL401", "no credential").await;
        refused(&runtime, &decide(Some(&rev_old), "g-ana", "approved", false, false), "AL401", "invalid or revoked").await;
        // A member decides no one else's gate; nobody approves their own with another
        // reviewer there; `override` is an admin's; `high` needs the step-up.
        refused(&runtime, &decide(Some(&ana2), "g-rev", "approved", false, false), "AL403", "only reviewers and admins").await;
        refused(&runtime, &decide(Some(&rev), "g-rev", "approved", false, false), "AL403", "nobody approves their own").await;
        refused(&runtime, &decide(Some(&rev), "g-rev", "approved", true, false), "AL403", "for admins only").await;
        refused(&runtime, &decide(Some(&ana2), "g-ana", "approved", false, false), "AL403", "nobody approves their own").await;
        refused(&runtime, &decide(Some(&rev), "g-high", "approved", false, false), "AL403", "step_up_required").await;
        refused(&runtime, &decide(Some(&rev), "g-ana", "abandoned", false, false), "AL403", "only the requester").await;
        // Accepted: a reviewer's approval; the requester's own withdrawal (self); an admin's
        // override on their own (self); a step-up decision; then the gate is decided.
        assert_eq!(one(&runtime, &decide(Some(&rev), "g-ana", "approved", false, false)).await, "done");
        assert_eq!(one(&runtime, &decide(Some(&rev), "g-rev", "abandoned", false, false)).await, "done");
        assert_eq!(one(&runtime, &decide(Some(&adm), "g-adm", "approved", true, false)).await, "done");
        assert_eq!(one(&runtime, &decide(Some(&adm), "g-high", "denied", false, true)).await, "done");
        assert_eq!(one(&runtime, &decide(Some(&adm), "g-ana", "denied", false, false)).await, "not_pending");
        assert_eq!(one(&runtime, &format!("SELECT count(*) FROM ({}) x", decide(Some(&rev), "nope", "denied", false, false))).await, "0");
        assert_eq!(
            one(&owner, "SELECT string_agg(gate_id || ':' || state || ':' || actor || ':' || self || ':' || step_up, ',' ORDER BY gate_id) FROM gate_decisions").await,
            format!("g-adm:approved:{adm_id}:true:false,g-ana:approved:{rev_id}:false:false,g-high:denied:{adm_id}:false:true,g-rev:abandoned:{rev_id}:true:false")
        );
        insert_only(&owner, "UPDATE gate_decisions SET state = 'denied'").await;
        insert_only(&owner, "DELETE FROM gates").await;

        // --- The review log (migration 0012): the runtime role appends leaves, tier hashes,
        // checkpoints and cosignatures, and changes none of them. ---
        runtime
            .batch_execute(&format!(
                "INSERT INTO log_leaves (idx, event_pk, user_id, source, id, received_at, payload_sha256, leaf_hash)
                   VALUES (0, 1, '{ana_id}', 'egress', 'ok-1', 0, sha256('p'), sha256('l'));
                 INSERT INTO log_tiers (level, idx, hash) VALUES (1, 0, sha256('t'));
                 INSERT INTO log_checkpoints (size, root, note, signed_at) VALUES (1, sha256('l'), 'n', 0);
                 INSERT INTO log_cosigners (key, user_id) VALUES ('k+1+AA', '{ana_id}');
                 INSERT INTO log_cosignatures (key, user_id, size, root, time, line, at)
                   VALUES ('k+1+AA', '{ana_id}', 1, sha256('l'), 0, 'l', 0);"
            ))
            .await
            .unwrap();
        for sql in [
            "UPDATE log_leaves SET leaf_hash = sha256('x')",
            "DELETE FROM log_leaves",
            "TRUNCATE log_leaves",
            "UPDATE log_tiers SET hash = sha256('x')",
            "DELETE FROM log_tiers",
            "UPDATE log_checkpoints SET note = 'x'",
            "DELETE FROM log_checkpoints",
            "TRUNCATE log_checkpoints",
            "UPDATE log_cosigners SET user_id = 'x'",
            "DELETE FROM log_cosigners",
            "UPDATE log_cosignatures SET size = 2",
            "DELETE FROM log_cosignatures",
            "SELECT setval('log_checkpoints_n_seq', 1)",
            "SELECT setval('log_cosignatures_n_seq', 1)",
        ] {
            denied(&runtime, sql).await;
        }
        // Gapless by construction: an index or an event is there once.
        refused(
            &runtime,
            &format!("INSERT INTO log_leaves (idx, event_pk, user_id, source, id, received_at, payload_sha256, leaf_hash)
               VALUES (0, 2, '{ana_id}', 'egress', 'x', 0, sha256('p'), sha256('m'))"),
            "23505",
            "duplicate key",
        )
        .await;
        refused(
            &runtime,
            &format!("INSERT INTO log_leaves (idx, event_pk, user_id, source, id, received_at, payload_sha256, leaf_hash)
               VALUES (1, 1, '{ana_id}', 'egress', 'x', 0, sha256('p'), sha256('m'))"),
            "23505",
            "duplicate key",
        )
        .await;
        // The owner too (each table holds a row, so the row triggers fire).
        for (t, col) in [
            ("log_leaves", "idx"),
            ("log_tiers", "idx"),
            ("log_checkpoints", "n"),
            ("log_cosigners", "key"),
            ("log_cosignatures", "n"),
        ] {
            insert_only(&owner, &format!("UPDATE {t} SET {col} = {col}")).await;
            insert_only(&owner, &format!("TRUNCATE {t} CASCADE")).await;
        }
        for t in ["log_leaves", "log_tiers", "log_checkpoints", "log_cosignatures"] {
            insert_only(&owner, &format!("DELETE FROM {t}")).await;
        }

        // --- The admin role: users, roles, tokens, revocations; no evidence at all. ---
        admin
            .batch_execute(&format!("INSERT INTO user_roles (user_id, role) VALUES ('{ana_id}', 'member')"))
            .await
            .unwrap();
        for sql in [
            "SELECT count(*) FROM events".to_string(),
            "SELECT count(*) FROM flags".into(),
            "SELECT count(*) FROM flag_states".into(),
            format!("INSERT INTO events (pk, user_id, source, id, type, ts, payload) VALUES (1, '{ana_id}', 'egress', 'x', 't', 0, '{{}}')"),
            format!("INSERT INTO event_keys (user_id, source, id, pk) VALUES ('{ana_id}', 'egress', 'x', 1)"),
            "INSERT INTO flags (id, rule_id, title, severity, user_id, detail) VALUES ('x', 'r', 't', 'high', 'u', 'd')".into(),
            format!("INSERT INTO flag_states (flag_id, state, actor, at) VALUES ('f-ana', 'open', '{ana_id}', now())"),
            "UPDATE users SET email = 'x@example.test'".into(),
            "DELETE FROM tokens".into(),
            "DELETE FROM token_revocations".into(),
            "TRUNCATE users".into(),
            "UPDATE user_roles SET role = 'admin'".into(),
            "INSERT INTO schema_migrations (version) VALUES (999)".into(),
            flag_call(Some(&adm), "f-ana", "resolved", false),
            assign_call(Some(&adm), "f-ana", Some(&adm_id), false),
            "SELECT count(*) FROM gates".into(),
            "SELECT count(*) FROM gate_decisions".into(),
            "SELECT count(*) FROM log_leaves".into(),
            "SELECT count(*) FROM log_tiers".into(),
            "SELECT count(*) FROM log_checkpoints".into(),
            "SELECT count(*) FROM log_cosigners".into(),
            "SELECT count(*) FROM log_cosignatures".into(),
            "INSERT INTO log_checkpoints (size, root, note, signed_at) VALUES (1, sha256('l'), 'n', 0)".into(),
            format!("SELECT * FROM airlock_gate_decide('{adm}', 'g-ana', 'denied', NULL, NULL, false, false)"),
            "SELECT * FROM airlock_gate_expire(10)".into(),
        ] {
            denied(&admin, &sql).await;
        }

        // --- The owner: every TRUNCATE, UPDATE and DELETE stopped by trigger. ---
        let partitions: Vec<String> = owner
            .query("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'events'::regclass", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(partitions.iter().any(|p| p == "events_default") && partitions.len() >= 4, "{partitions:?}");
        for p in &partitions {
            insert_only(&owner, &format!("TRUNCATE {p}")).await;
        }
        // Row triggers fire per row: `events` holds the runtime role's row.
        insert_only(&owner, "DELETE FROM events").await;
        insert_only(&owner, "UPDATE events SET payload = '{}'").await;
        // CASCADE: without it a referenced table is refused by its foreign keys first.
        for t in ["schema_migrations", "events", "event_keys", "users", "tokens", "flags"] {
            insert_only(&owner, &format!("TRUNCATE {t} CASCADE")).await;
        }
        insert_only(&owner, "UPDATE schema_migrations SET version = version").await;
        insert_only(&owner, "DELETE FROM schema_migrations").await;
        refused(
            &owner,
            &format!("INSERT INTO events (pk, user_id, source, id, type, ts, received_at, payload)
               VALUES (nextval('events_pk_seq'), '{ana_id}', 'egress', 'bd2', 'connect', 0, '2020-01-01', '{{}}')"),
            "42501",
            "set by the database",
        )
        .await;
        // The function is the owner's, pinned, and not executable by PUBLIC.
        assert_eq!(
            one(&owner, "SELECT prosecdef::text || ' ' || array_to_string(proconfig, ';') FROM pg_proc WHERE proname = 'airlock_flag_state'").await,
            "true search_path=pg_catalog, public, pg_temp"
        );
        assert_eq!(one(&owner, "SELECT has_function_privilege('public', 'airlock_flag_state(text,text,text,text,boolean)', 'EXECUTE')::text").await, "false");
        assert_eq!(
            one(&owner, "SELECT prosecdef::text || ' ' || array_to_string(proconfig, ';') FROM pg_proc WHERE proname = 'airlock_flag_assign'").await,
            "true search_path=pg_catalog, public, pg_temp"
        );
        assert_eq!(one(&owner, "SELECT has_function_privilege('public', 'airlock_flag_assign(text,text,text,text,boolean)', 'EXECUTE')::text").await, "false");
        for f in ["airlock_gate_decide", "airlock_gate_expire"] {
            assert_eq!(
                one(&owner, &format!("SELECT prosecdef::text || ' ' || array_to_string(proconfig, ';') FROM pg_proc WHERE proname = '{f}'")).await,
                "true search_path=pg_catalog, public, pg_temp"
            );
        }
        assert_eq!(one(&owner, "SELECT has_function_privilege('public', 'airlock_gate_decide(text,text,text,text,text,boolean,boolean)', 'EXECUTE')::text").await, "false");
        assert_eq!(one(&owner, "SELECT has_function_privilege('public', 'airlock_credential(text)', 'EXECUTE')::text").await, "false");
    });
}

/// Version 1's migrate: the schema, and the runtime role with SELECT + INSERT on every table
/// and USAGE on every sequence (what `grant_runtime` granted then).
const V1_GRANTS: &str = "REVOKE ALL ON schema_migrations, users, user_roles, tokens, token_revocations, events, event_keys, flags, flag_events, flag_states FROM {r};
 GRANT SELECT, INSERT ON schema_migrations, users, user_roles, tokens, token_revocations, events, event_keys, flags, flag_events, flag_states TO {r};
 GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {r};";

#[test]
fn pg_remigrating_a_version_1_database_revokes_its_grants() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    let now = time::OffsetDateTime::now_utc();
    let part = format!("events_{:04}_{:02}", now.year(), u8::from(now.month()));
    let (ny, nm) = if u8::from(now.month()) == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), u8::from(now.month()) + 1)
    };
    rt().block_on(async {
        let owner = pg(&db.owner_url).await;
        owner
            .batch_execute(&format!(
                "CREATE TABLE schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
                 BEGIN; {}; INSERT INTO schema_migrations(version) VALUES (1); COMMIT;
                 CREATE TRIGGER schema_migrations_insert_only BEFORE UPDATE OR DELETE ON schema_migrations
                   FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();
                 CREATE TABLE {part} PARTITION OF events FOR VALUES FROM ('{:04}-{:02}-01') TO ('{ny:04}-{nm:02}-01');
                 {}",
                include_str!("../../src/review/migrations/pg_0001.sql"),
                now.year(),
                u8::from(now.month()),
                V1_GRANTS.replace("{r}", &db.role),
            ))
            .await
            .unwrap();
        // What version 1 let the runtime role do: a user, a working token, a backdated event.
        let runtime = pg(&db.runtime_url).await;
        runtime
            .batch_execute(
                "INSERT INTO users (id, email) VALUES ('u1', 'old@example.test');
                 INSERT INTO user_roles (user_id, role) VALUES ('u1', 'admin');
                 INSERT INTO tokens (id, user_id, hash) VALUES ('t1', 'u1', sha256('alk_old'));
                 INSERT INTO events (pk, user_id, source, id, type, ts, received_at, payload)
                   VALUES (nextval('events_pk_seq'), 'u1', 'egress', 'old-1', 'connect', 0, now() - interval '1 day', '{}');",
            )
            .await
            .unwrap();
    });
    db.migrate(&world);
    rt().block_on(async {
        let owner = pg(&db.owner_url).await;
        let runtime = pg(&db.runtime_url).await;
        // Every later migration, 4 (the grants) among them, applied on top of version 1.
        let applied = one(&owner, "SELECT string_agg(version::text, ',' ORDER BY version) FROM schema_migrations").await;
        assert!(applied.starts_with("1,") && applied.split(',').any(|v| v == "4"), "applied: {applied}");
        grants_match_the_docs(&owner, &db.role, &db.admin_role).await;
        denied(&runtime, "INSERT INTO users (id, email) VALUES ('u2', 'evil@example.test')").await;
        denied(&runtime, "INSERT INTO tokens (id, user_id, hash) VALUES ('t2', 'u1', sha256('alk_evil'))").await;
        denied(&runtime, "INSERT INTO flag_states (flag_id, state, actor, at) VALUES ('x', 'open', 'u1', now())").await;
        refused(
            &runtime,
            "INSERT INTO events (pk, user_id, source, id, type, ts, received_at, payload)
               VALUES (nextval('events_pk_seq'), 'u1', 'egress', 'old-2', 'connect', 0, now() - interval '1 day', '{}')",
            "42501",
            "set by the database",
        )
        .await;
        // The partition version 1 made now refuses TRUNCATE; the old rows are intact.
        insert_only(&owner, &format!("TRUNCATE {part}")).await;
        insert_only(&owner, "TRUNCATE events_default").await;
        insert_only(&owner, "TRUNCATE schema_migrations").await;
        assert_eq!(one(&runtime, "SELECT count(*) FROM events").await, "1");
        // The old admin token works through the function (it is a real, unrevoked token).
        runtime
            .batch_execute("INSERT INTO flags (id, rule_id, title, severity, user_id, detail) VALUES ('f1', 'r', 't', 'high', 'u2x', 'd')")
            .await
            .unwrap();
        runtime.batch_execute(&flag_call(Some("alk_old"), "f1", "resolved", false)).await.unwrap();
        // The sole reviewer/admin may act on their own history: allowed, marked self.
        runtime
            .batch_execute("INSERT INTO flags (id, rule_id, title, severity, user_id, detail) VALUES ('f2', 'r', 't', 'high', 'u1', 'd')")
            .await
            .unwrap();
        runtime.batch_execute(&flag_call(Some("alk_old"), "f2", "dismissed", false)).await.unwrap();
        // So may the assignment function (migration 9 on top of version 1).
        runtime.batch_execute(&assign_call(Some("alk_old"), "f2", Some("u1"), false)).await.unwrap();
        assert_eq!(
            one(&owner, "SELECT string_agg(flag_id || ':' || state || ':' || self, ',' ORDER BY n) FROM flag_states").await,
            "f1:resolved:false,f2:dismissed:true,f2:dismissed:true"
        );
    });
    // Re-running is idempotent.
    db.migrate(&world);
    rt().block_on(async {
        let owner = pg(&db.owner_url).await;
        grants_match_the_docs(&owner, &db.role, &db.admin_role).await;
    });
}

/// `migrate` refuses a runtime role that is a superuser: no grant would bind it.
#[test]
fn pg_migrate_refuses_a_superuser_runtime_role() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    let run = world
        .airlockd(world.tmp.path())
        .args(["review", "migrate", "--database", &db.owner_url, "--runtime-role", "postgres"])
        .run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("superuser"), "{}", run.stderr());
}

/// The server's connections carry `statement_timeout` (default 30 s; the option appends to a
/// URL's own `options`).
#[test]
fn pg_runtime_connections_carry_a_statement_timeout() {
    use airlock::review::store::pg_tls::{DEFAULT_STATEMENT_TIMEOUT, PgOptions, PgTarget};
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    rt().block_on(async {
        let opts = PgOptions { statement_timeout: Some(DEFAULT_STATEMENT_TIMEOUT), ca: None };
        let c = PgTarget::new(&db.runtime_url, &opts).unwrap().connect().await.unwrap();
        assert_eq!(one(&c, "SHOW statement_timeout").await, "30s");
        let url = format!("{}?options=-c%20work_mem%3D8MB", db.runtime_url);
        let opts =
            PgOptions { statement_timeout: Some(std::time::Duration::from_millis(50)), ca: None };
        let c = PgTarget::new(&url, &opts).unwrap().connect().await.unwrap();
        assert_eq!(one(&c, "SHOW statement_timeout").await, "50ms");
        assert_eq!(one(&c, "SHOW work_mem").await, "8MB");
        refused(&c, "SELECT pg_sleep(5)", "57014", "statement timeout").await;
    });
}

/// Regression (issue 13, small gaps): `airlockd admin` connected as the runtime role printed
/// PostgreSQL's bare `42501` and nothing about which role to use.
#[test]
fn admin_as_the_runtime_role_says_which_role_to_use() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let run = world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "add", "--email", "eve@example.test", "--role", "admin"])
        .args(["--database", &db.runtime_url])
        .run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("42501"), "{}", run.stderr());
    assert!(run.stderr().contains("--admin-role"), "{}", run.stderr());
    assert!(run.stderr().contains("runtime role"), "{}", run.stderr());
    // Nothing was written.
    let listed = world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "list", "--database", &db.admin_url])
        .run();
    assert!(!listed.stdout().contains("eve@example.test"), "{}", listed.stdout());
}
