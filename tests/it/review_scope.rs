//! What a member can learn and what the server writes down, on both stores through the real
//! `airlockd review`: a member asking for any other user (an existing email, an unknown email,
//! any id) gets the same 403, so the answers reveal nothing about who exists; and a server
//! logging at `debug` or `trace` never writes a request body or payload to its log.

use crate::review_support::*;
use crate::support::World;

fn members_cannot_probe_for_users(world: &World, store: &StoreSel) {
    let member = user_with_token(world, store, "m@example.test", "member");
    user_with_token(world, store, "other@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let me = get(base, &member, "/api/v1/me", &[]).json();
    let own_id = me["id"].as_str().unwrap().to_string();
    for endpoint in ["events", "flags"] {
        let mut answers = Vec::new();
        for user in [
            "other@example.test",
            "nobody@example.test",
            "00000000000000000000000000000000",
            "not-an-id",
        ] {
            let r = get(base, &member, &format!("/api/v1/{endpoint}?user={user}"), &[]);
            assert_eq!(r.status, 403, "{endpoint}?user={user}: {}", r.body);
            answers.push(r.body);
        }
        // Byte-identical answers: existing and unknown users cannot be told apart.
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "{endpoint}: {answers:?}");
        // Naming oneself, by email or id, is fine.
        for user in ["m@example.test", own_id.as_str()] {
            let r = get(base, &member, &format!("/api/v1/{endpoint}?user={user}"), &[]);
            assert_eq!(r.status, 200, "{endpoint}?user={user}: {}", r.body);
        }
    }
}

#[test]
fn members_get_403_for_any_other_user_existing_or_not_embedded() {
    let world = World::new();
    members_cannot_probe_for_users(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn members_get_403_for_any_other_user_existing_or_not_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    members_cannot_probe_for_users(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// Runs a server at `level`, sends a payload, a flag-raising line and a flag note that each
/// hold a unique marker (and a refused body that holds it), reads them back, and checks the
/// marker, the secret and the tokens never reached the log.
fn logs_hold_no_payloads(world: &World, store: &StoreSel, level: &str) {
    let member = user_with_token(world, store, &format!("m-{level}@example.test"), "member");
    let rev = user_with_token(world, store, &format!("r-{level}@example.test"), "reviewer");
    let server = Server::start_with_env(world, store, &[], "http", &[("AIRLOCK_LOG", level)]);
    let base = server.base.as_str();
    let marker = format!("PAYLOADMARKER{level}7f3a9c");
    let mut line = egress(&format!("{level}-1"), "pastebin.com", false);
    line["payload"]["note"] = serde_json::json!(marker);
    let secret = serde_json::json!({
        "id": format!("{level}-2"), "source": "external", "type": "deploy.log",
        "ts": "2026-03-04T09:12:05Z",
        "payload": {"text": format!("{marker} AKIAZ3MARKERQ7XYWQ2K aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/{marker}")}
    });
    let body = format!("{line}\n{secret}\n");
    let f = write_file(world.tmp.path(), &format!("{level}.ndjson"), body.as_bytes());
    let r = post_events(base, &member, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = all_events(base, &member, "");
    assert!(events.iter().any(|e| e.to_string().contains(&marker)), "stored: {events:?}");
    let flags = get(base, &rev, "/api/v1/flags", &[]).json();
    let id = flags["flags"][0]["id"].as_str().unwrap().to_string();
    let auth = format!("Authorization: Bearer {rev}");
    let note = format!(r#"{{"action":"acknowledge","note":"{marker}"}}"#);
    let r = curl(&["-H", &auth, "-d", &note, &format!("{base}/api/v1/flags/{id}")]);
    assert_eq!(r.status, 200, "{}", r.body);
    // A body the server refuses is not logged either.
    let bad = write_file(world.tmp.path(), "bad.json", format!("[{{\"{marker}\": ").as_bytes());
    assert_eq!(post_events(base, &member, &bad, "application/json", &[]).status, 400);
    let log = server.log();
    assert!(!log.contains(&marker), "AIRLOCK_LOG={level} logged a payload:\n{log}");
    assert!(!log.contains("AKIAZ3MARKER"), "AIRLOCK_LOG={level} logged a secret:\n{log}");
    assert!(!log.contains(&rev) && !log.contains(&member), "a token in the log:\n{log}");
}

#[test]
fn debug_logs_never_hold_payloads_embedded() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    for level in ["debug", "trace"] {
        logs_hold_no_payloads(&world, &store, level);
    }
}

#[test]
fn debug_logs_never_hold_payloads_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    for level in ["debug", "trace"] {
        logs_hold_no_payloads(&world, &store, level);
    }
}
