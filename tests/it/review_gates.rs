//! Action gates on the review plane (issue 18; docs/api.md "Gates", docs/gates.md "With a
//! review server") through the real `airlockd review` and curl, on both stores: an external
//! agent opens a gate and long-polls it while a reviewer decides; decisions are single-use and
//! bound to the digest; nobody approves their own gate while another reviewer exists (the
//! sole-reviewer, admin-override and self-approval exceptions are marked `self`); a `high`
//! gate needs the decider's password (403 `step_up_required`, `step_up_failed`); expiry is
//! written by the server; every step is a `gate.*` event of the requester's history; and
//! clients still cannot write `source: "gate"` themselves.

use crate::console_auth::set_password;
use crate::review_flags::user_id;
use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};
use std::time::Duration;

const PW: &str = "correct horse battery";

pub(crate) fn post_json(base: &str, token: &str, path: &str, body: &Value) -> Http {
    let auth = format!("Authorization: Bearer {token}");
    let body = body.to_string();
    curl(&[
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        &format!("{base}{path}"),
    ])
}

/// Opens a gate; asserts 201 and returns it.
pub(crate) fn open_gate(base: &str, token: &str, body: &Value) -> Value {
    let r = post_json(base, token, "/api/v1/gates", body);
    assert_eq!(r.status, 201, "{}", r.body);
    r.json()
}

fn decide(base: &str, token: &str, id: &str, body: &Value) -> Http {
    post_json(base, token, &format!("/api/v1/gates/{id}"), body)
}

fn reason(r: &Http) -> String {
    r.json()["reason"].as_str().unwrap_or_default().to_string()
}

fn gate_events(base: &str, reviewer: &str, user: &str) -> Vec<Value> {
    all_events(base, reviewer, &format!("&source=gate&user={user}"))
}

fn gates_suite(world: &World, store: &StoreSel) {
    let adm = user_with_token(world, store, "adm@example.test", "admin");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let dev = user_with_token(world, store, "dev@example.test", "member");
    let bot = user_with_token(world, store, "bot@example.test", "member");
    set_password(world, store, "rev@example.test", &format!("{PW}\n")).expect_code(0);
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let dev_id = user_id(base, &dev);

    // --- An external agent's gate: opened, listed, waited on, approved once. ---
    let g = open_gate(
        base,
        &dev,
        &json!({"action": "deploy payments v2.3 to production", "context": {"pipeline": 881},
                "severity": "medium", "timeout": 60}),
    );
    let id = g["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("gt_"), "{g}");
    assert_eq!((g["state"].as_str(), g["kind"].as_str()), (Some("pending"), Some("external")));
    assert_eq!(g["user_email"], "dev@example.test");
    assert_eq!(g["request"], "deploy payments v2.3 to production");
    assert_eq!(g["context"]["pipeline"], 881);
    let digest = g["digest"].as_str().unwrap().to_string();
    // The digest is the SHA-256 of the canonical text shown.
    assert_eq!(digest, airlock::gate::digest(g["action"].as_str().unwrap()));
    // Listed for the requester and for reviewers; another member sees nothing of it.
    let pending = |token: &str| {
        let r = get(base, token, "/api/v1/gates?state=pending", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["gates"].as_array().unwrap().iter().map(|g| g["id"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(pending(&dev), [json!(id)]);
    assert_eq!(pending(&rev), [json!(id)]);
    assert!(pending(&bot).is_empty());
    let r = get(base, &bot, &format!("/api/v1/gates/{id}"), &[]);
    assert_eq!((r.status, reason(&r)), (404, "no_gate".into()), "{}", r.body);
    let r = get(base, &bot, &format!("/api/v1/gates?user={dev_id}"), &[]);
    assert_eq!(r.status, 403, "a member names no one else: {}", r.body);
    // The requester waits; the reviewer approves meanwhile: the wait answers the decision.
    let waiter = {
        let (base, dev, id) = (base.to_string(), dev.clone(), id.clone());
        std::thread::spawn(move || get(&base, &dev, &format!("/api/v1/gates/{id}?wait=30"), &[]))
    };
    std::thread::sleep(Duration::from_millis(500));
    // A member cannot decide someone else's gate, and a wrong digest decides nothing.
    let r = decide(base, &bot, &id, &json!({"action": "approve"}));
    assert_eq!(r.status, 404, "{}", r.body);
    let r = decide(base, &rev, &id, &json!({"action": "approve", "digest": "sha256:00"}));
    assert_eq!((r.status, reason(&r)), (409, "digest_mismatch".into()), "{}", r.body);
    let r = decide(
        base,
        &rev,
        &id,
        &json!({"action": "approve", "digest": digest, "note": "release ticket 4411"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["state"], "approved");
    assert_eq!(v["decision"]["by_email"], "rev@example.test");
    assert_eq!(
        (v["decision"]["self"].as_bool(), v["decision"]["step_up"].as_bool()),
        (Some(false), Some(false))
    );
    let waited = waiter.join().unwrap();
    assert_eq!(waited.status, 200, "{}", waited.body);
    assert_eq!(waited.json()["state"], "approved", "the wait ended with the decision");
    // Single use: a second decision of any kind is refused with the state it is in.
    for action in ["approve", "deny", "abandon"] {
        let r = decide(base, &rev, &id, &json!({"action": action}));
        assert_eq!((r.status, reason(&r)), (409, "not_pending".into()), "{action}: {}", r.body);
        assert_eq!(r.json()["gate"]["state"], "approved");
    }

    // --- Nobody approves their own gate while another reviewer exists. ---
    let own = open_gate(base, &rev, &json!({"action": "rotate the signing key"}));
    let own_id = own["id"].as_str().unwrap();
    let r = decide(base, &rev, own_id, &json!({"action": "approve"}));
    assert_eq!((r.status, reason(&r)), (403, "refused".into()), "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("nobody approves their own"),
        "{}",
        r.body
    );
    let r = decide(base, &rev, own_id, &json!({"action": "approve", "override": true}));
    assert_eq!(r.status, 403, "override is an admin's: {}", r.body);
    // Another reviewer (here the admin) may; the requester may always deny or withdraw.
    let r = decide(base, &adm, own_id, &json!({"action": "approve"}));
    assert_eq!(
        (r.status, r.json()["decision"]["self"].as_bool()),
        (200, Some(false)),
        "{}",
        r.body
    );
    let own2 = open_gate(base, &dev, &json!({"action": "drop the staging database"}));
    let r = decide(base, &dev, own2["id"].as_str().unwrap(), &json!({"action": "approve"}));
    assert_eq!(r.status, 403, "a member approves nothing of their own: {}", r.body);
    let r =
        decide(base, &dev, own2["id"].as_str().unwrap(), &json!({"action": "deny", "note": "no"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.json()["state"].as_str(), r.json()["decision"]["self"].as_bool()),
        (Some("denied"), Some(true))
    );
    let own3 = open_gate(base, &dev, &json!({"action": "x"}));
    let r = decide(base, &rev, own3["id"].as_str().unwrap(), &json!({"action": "abandon"}));
    assert_eq!(r.status, 403, "only the requester withdraws: {}", r.body);
    let r = decide(base, &dev, own3["id"].as_str().unwrap(), &json!({"action": "abandon"}));
    assert_eq!((r.status, r.json()["state"].as_str()), (200, Some("abandoned")), "{}", r.body);
    // The admin override: allowed, and marked self.
    let mine = open_gate(base, &adm, &json!({"action": "admin's own step"}));
    let r = decide(
        base,
        &adm,
        mine["id"].as_str().unwrap(),
        &json!({"action": "approve", "override": true}),
    );
    assert_eq!((r.status, r.json()["decision"]["self"].as_bool()), (200, Some(true)), "{}", r.body);
    // A client's managed-layer claim (`self_approve`) is honoured under the default setting.
    let claimed =
        open_gate(base, &dev, &json!({"action": "fleet-allowed step", "self_approve": true}));
    assert_eq!(claimed["self_approve"], true);
    let r = decide(base, &dev, claimed["id"].as_str().unwrap(), &json!({"action": "approve"}));
    assert_eq!((r.status, r.json()["decision"]["self"].as_bool()), (200, Some(true)), "{}", r.body);

    // --- Step-up: a high gate needs the decider's password. ---
    let high = open_gate(base, &dev, &json!({"action": "refund 12,000 EUR", "severity": "high"}));
    let high_id = high["id"].as_str().unwrap();
    let r = decide(base, &rev, high_id, &json!({"action": "approve"}));
    assert_eq!((r.status, reason(&r)), (403, "step_up_required".into()), "{}", r.body);
    assert!(
        r.headers.to_ascii_lowercase().contains("x-airlock-reason: step_up_required"),
        "{}",
        r.headers
    );
    let r = decide(base, &rev, high_id, &json!({"action": "approve", "password": "guess"}));
    assert_eq!((r.status, reason(&r)), (403, "step_up_failed".into()), "{}", r.body);
    // The admin has no console password: they cannot step up at all.
    let r = decide(base, &adm, high_id, &json!({"action": "deny", "password": PW}));
    assert_eq!((r.status, reason(&r)), (403, "step_up_failed".into()), "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("no console password"), "{}", r.body);
    let r = decide(base, &rev, high_id, &json!({"action": "approve", "password": PW}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["decision"]["step_up"], true);
    // The failed attempt is in the reviewer's own history, like a failed sign-in.
    let rev_events = all_events(base, &adm, "&user=rev@example.test");
    assert!(
        rev_events.iter().any(|e| e["type"] == "airlock.auth.step_up_failed"),
        "{rev_events:?}"
    );

    // --- Expiry: written by the server once the deadline passes. ---
    let short = open_gate(base, &dev, &json!({"action": "short-lived", "timeout": 1}));
    let short_id = short["id"].as_str().unwrap();
    let r = get(base, &dev, &format!("/api/v1/gates/{short_id}?wait=10"), &[]);
    assert_eq!(r.json()["state"], "expired", "{}", r.body);
    let r = decide(base, &rev, short_id, &json!({"action": "approve"}));
    assert_eq!((r.status, reason(&r)), (409, "not_pending".into()), "{}", r.body);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = gate_events(base, &rev, &dev_id);
        if ev.iter().any(|e| e["id"] == format!("{short_id}:expired")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no gate.expired event: {ev:?}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // --- The record: every step a `gate.*` event of the requester's history. ---
    let ev = gate_events(base, &rev, &dev_id);
    let kinds: Vec<(String, String)> = ev
        .iter()
        .filter(|e| e["id"].as_str().unwrap().starts_with(&id))
        .map(|e| (e["id"].as_str().unwrap().into(), e["type"].as_str().unwrap().into()))
        .collect();
    assert_eq!(
        kinds,
        [
            (format!("{id}:requested"), "gate.requested".to_string()),
            (format!("{id}:approved"), "gate.approved".to_string())
        ]
    );
    let approved = ev.iter().find(|e| e["id"] == format!("{id}:approved")).unwrap();
    let p = &approved["payload"];
    assert_eq!(
        (p["by_email"].as_str(), p["note"].as_str()),
        (Some("rev@example.test"), Some("release ticket 4411"))
    );
    assert_eq!(
        (p["digest"].as_str(), p["user_email"].as_str()),
        (Some(digest.as_str()), Some("dev@example.test"))
    );
    // Clients cannot write them.
    let forged = json!([{"id": format!("{id}:approved"), "source": "gate", "type": "gate.approved",
        "ts": "2026-12-01T00:00:00Z", "payload": {}}]);
    let f = write_file(world.tmp.path(), "forged.json", forged.to_string().as_bytes());
    let r = post_events(base, &dev, &f, "application/json", &[]);
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(r.json()["results"][0]["code"], 403);

    // --- Bad requests say what is wrong. ---
    for (path, body, want) in [
        ("/api/v1/gates", json!({"action": ""}), "`action` is required"),
        ("/api/v1/gates", json!({"action": "x", "timeout": 0}), "whole seconds"),
        ("/api/v1/gates", json!({"kind": "egress", "action": "{}"}), "kind"),
        (
            &format!("/api/v1/gates/{id}") as &str,
            json!({"action": "maybe"}),
            "approve, deny or abandon",
        ),
    ] {
        let r = post_json(base, &dev, path, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.json()["error"].as_str().unwrap().contains(want), "{body}: {}", r.body);
    }
    let r = get(base, &dev, &format!("/api/v1/gates/{id}?wait=61"), &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = get(base, &dev, "/api/v1/gates?state=maybe", &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = curl(&[
        "-X",
        "DELETE",
        "-H",
        &format!("Authorization: Bearer {dev}"),
        &format!("{base}/api/v1/gates/{id}"),
    ]);
    assert_eq!(r.status, 405, "{}", r.body);
    assert!(r.headers.contains("GET, POST"), "{}", r.headers);
    let r = get(base, "alk_wrong", "/api/v1/gates", &[]);
    assert_eq!(r.status, 401);
}

#[test]
fn gates_on_the_embedded_store() {
    let world = World::new();
    gates_suite(&world, &StoreSel::Embedded(world.tmp.path().join("store")));
}

#[test]
fn gates_on_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    gates_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// The pending caps: a flood of gates from one session is refused (429 `gate_limit`) without
/// storing anything, and the sole reviewer of a store may decide their own (marked `self`).
#[test]
fn a_flood_of_gates_is_capped_and_a_sole_reviewer_decides_their_own() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let solo = user_with_token(&world, &store, "solo@example.test", "admin");
    let server = Server::start(&world, &store, &["--gate-self-approve", "never"]);
    let base = server.base.as_str();
    let action = |n: usize| {
        airlock::gate::ToolAction {
            session: "S1",
            attempt: &format!("q{n}"),
            tool: "Bash",
            action: "git push",
        }
        .canonical()
    };
    for n in 0..airlock::review::gates::MAX_PENDING_PER_SESSION {
        open_gate(base, &solo, &json!({"kind": "tool", "action": action(n)}));
    }
    let r = post_json(base, &solo, "/api/v1/gates", &json!({"kind": "tool", "action": action(99)}));
    assert_eq!((r.status, reason(&r)), (429, "gate_limit".into()), "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("retry-after"), "{}", r.headers);
    let listed = get(base, &solo, "/api/v1/gates?state=pending&limit=1000", &[]).json();
    let listed = listed["gates"].as_array().unwrap();
    assert_eq!(listed.len(), airlock::review::gates::MAX_PENDING_PER_SESSION);
    assert_eq!(listed[0]["request"], "git push", "oldest first: {:?}", listed[0]);
    // The claim is not honoured under `never`; the sole admin still decides (marked self).
    let g = open_gate(base, &solo, &json!({"action": "solo step", "self_approve": true}));
    assert_eq!(g["self_approve"], false);
    let r = decide(base, &solo, g["id"].as_str().unwrap(), &json!({"action": "approve"}));
    assert_eq!((r.status, r.json()["decision"]["self"].as_bool()), (200, Some(true)), "{}", r.body);
    let m = get(base, &solo, "/metrics", &[]).body;
    assert!(m.contains("airlock_review_rate_limited_total{limit=\"gate_pending\"} 1"), "{m}");
    assert!(m.contains("airlock_review_gate_steps_total{step=\"approved\"} 1"), "{m}");
}
