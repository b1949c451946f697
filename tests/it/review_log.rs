//! The review log's server side through the real `airlockd review`, on both stores
//! (docs/evidence.md): receipts, signed checkpoints that verify under the published key,
//! inclusion and consistency proofs that verify against them, hash tiles that hold exactly
//! the leaves rebuilt from the listed events, the caller's own leaf, and cosignatures.
//! The checks use `airlock::tlog`, whose proofs are tested against the RFC's algorithms.

use crate::review_support::*;
use crate::support::{World, wait_until};
use airlock::tlog::merkle::{Hash, root, verify_consistency, verify_inclusion};
use airlock::tlog::note::{Checkpoint, NoteSigner, NoteVerifier, open_checkpoint};
use airlock::tlog::{EventLeaf, b64, hash_from_b64, sha256};
use serde_json::{Value, json};
use std::time::Duration;

fn post_json(base: &str, token: &str, path: &str, body: &Value) -> Http {
    let auth = format!("Authorization: Bearer {token}");
    let data = body.to_string();
    let url = format!("{base}{path}");
    curl(&["-H", &auth, "-H", "Content-Type: application/json", "--data-binary", &data, &url])
}

fn hashes(v: &Value) -> Vec<Hash> {
    v["hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| hash_from_b64(h.as_str().unwrap()).unwrap())
        .collect()
}

/// The leaf of a listed event, rebuilt from what the API shows (the payload's text as sent:
/// these tests send compact JSON, which the API returns byte for byte).
fn leaf_of(e: &Value) -> Hash {
    let payload = e["payload"].to_string();
    EventLeaf {
        user_id: e["user_id"].as_str().unwrap(),
        source: e["source"].as_str().unwrap(),
        id: e["id"].as_str().unwrap(),
        received_at: airlock::review::parse_rfc3339(e["received_at"].as_str().unwrap()).unwrap(),
        payload_sha256: sha256(payload.as_bytes()),
    }
    .hash()
}

fn batch(world: &World, name: &str, from: usize, n: usize) -> std::path::PathBuf {
    let items: Vec<Value> = (from..from + n)
        .map(|i| {
            json!({"id": format!("e{i}"), "source": "external", "type": "x",
                   "ts": "2026-03-04T09:00:00Z", "payload": {"i": i}})
        })
        .collect();
    write_file(world.tmp.path(), name, json!(items).to_string().as_bytes())
}

/// The latest checkpoint, once it covers `size` leaves, opened with `key`.
fn checkpoint_covering(
    base: &str,
    token: &str,
    key: &NoteVerifier,
    size: u64,
) -> (Checkpoint, Value) {
    let mut got = None;
    wait_until(Duration::from_secs(20), || {
        let r = get(base, token, "/api/v1/log/checkpoint", &[]);
        if r.status != 200 {
            return false;
        }
        let v = r.json();
        let (cp, _) = open_checkpoint(v["checkpoint"].as_str().unwrap(), key).unwrap();
        let ok = cp.size >= size;
        got = Some((cp, v));
        ok
    });
    got.expect("a checkpoint covering the events")
}

fn log_suite(world: &World, store: &StoreSel, extra: &[&str]) {
    let ana = user_with_token(world, store, "ana@example.test", "member");
    let bob = user_with_token(world, store, "bob@example.test", "member");
    // One leaf lookup per event below: more requests than the default per-token rate.
    let mut args = vec!["--rate-limit-per-token", "100000", "--rate-limit-burst", "100000"];
    args.extend_from_slice(extra);
    let server = Server::start(world, store, &args);
    let base = &server.base;

    let r = get(base, &ana, "/api/v1/log/key", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let key = NoteVerifier::parse(r.json()["key"].as_str().unwrap()).unwrap();
    assert_eq!(r.json()["origin"], key.name.as_str());

    // 700 events: past two full tiles of tier 0, so tier 1 holds two hashes.
    let f = batch(world, "a.json", 0, 700);
    let r = post_events(base, &ana, &f, "application/json", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    for item in answer["results"].as_array().unwrap() {
        assert!(
            item["leaf_index"].is_u64()
                || (item["leaf_pending"] == true && item["deadline"].is_string()),
            "every created item carries its receipt: {item}"
        );
    }
    // A duplicate keeps its original's leaf (or is pending with it).
    let again = post_events(base, &ana, &f, "application/json", &[]).json();
    assert_eq!(again["duplicate"], 700, "{again}");

    let (cp, v) = checkpoint_covering(base, &ana, &key, 700);
    assert_eq!(v["tree_size"], cp.size);
    assert_eq!(v["root_hash"], b64(&cp.root).as_str());
    assert!(cp.time().is_some(), "the checkpoint carries its signing time");
    if let Some(note) = answer["checkpoint"].as_str() {
        let (c, _) = open_checkpoint(note, &key).unwrap();
        assert!(c.size >= 700, "a receipt's checkpoint covers the batch");
    }

    // The tree is exactly the leaves rebuilt from the listed events, in leaf order.
    let listed = all_events(base, &ana, "");
    let mut by_index: Vec<(u64, Hash, String)> = Vec::new();
    for e in &listed {
        let id = e["id"].as_str().unwrap();
        let l = get(base, &ana, &format!("/api/v1/log/leaf?source=external&id={id}"), &[]);
        if e["type"] != "x" {
            continue;
        }
        assert_eq!(l.status, 200, "{}", l.body);
        let l = l.json();
        let index = l["leaf_index"].as_u64().unwrap_or_else(|| panic!("sequenced: {l}"));
        assert_eq!(l["leaf_hash"], b64(&leaf_of(e)).as_str(), "leaf of {id}");
        by_index.push((index, leaf_of(e), id.to_string()));
    }
    by_index.sort();
    assert_eq!(by_index.len(), 700);
    // Indices are gapless from 0 (only ana's events are in this store's log so far).
    assert!(by_index.iter().enumerate().all(|(i, (n, _, _))| *n == i as u64), "gapless");
    let leaves: Vec<Hash> = by_index.iter().map(|(_, h, _)| *h).collect();
    assert_eq!(root(&leaves[..cp.size as usize]), cp.root, "the signed root is the leaves' root");

    // Inclusion proofs verify against the signed root.
    for index in [0u64, 1, 255, 256, 511, 699] {
        let r = get(
            base,
            &bob,
            &format!("/api/v1/log/proof/inclusion?index={index}&tree_size={}", cp.size),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        verify_inclusion(&leaves[index as usize], index, cp.size, &hashes(&r.json()), &cp.root)
            .unwrap_or_else(|e| panic!("leaf {index}: {e}"));
    }
    for bad in [
        "index=700&tree_size=700",
        "index=0&tree_size=999999",
        "index=x&tree_size=1",
        "tree_size=1",
    ] {
        let r = get(base, &ana, &format!("/api/v1/log/proof/inclusion?{bad}"), &[]);
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }

    // Hash tiles: tier 0 holds the leaf hashes, tier 1 the folds of 256 of them.
    let t = get_bytes(base, &ana, "/api/v1/log/tile/0/001");
    assert_eq!(t.len(), 256 * 32);
    assert_eq!(&t[..32], &leaves[256]);
    let t1 = get_bytes(base, &ana, "/api/v1/log/tile/1/000.p/2");
    assert_eq!(&t1[32..64], &root(&leaves[256..512]));
    assert_eq!(get(base, &ana, "/api/v1/log/tile/1/000", &[]).status, 404, "not full yet");
    let r = get(base, &ana, "/api/v1/log/tile/entries/000", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["reason"], "entry_tiles_not_served");
    assert_eq!(get(base, &ana, "/api/v1/log/tile/0/1", &[]).status, 400);

    // The tree grows; the consistency proof from the old head verifies.
    let f = batch(world, "b.json", 700, 50);
    assert_eq!(post_events(base, &bob, &f, "application/json", &[]).status, 200);
    let (cp2, _) = checkpoint_covering(base, &ana, &key, cp.size + 50);
    let r = get(
        base,
        &ana,
        &format!("/api/v1/log/proof/consistency?from={}&to={}", cp.size, cp2.size),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    verify_consistency(cp.size, cp2.size, &cp.root, &cp2.root, &hashes(&r.json())).unwrap();
    assert_eq!(get(base, &ana, "/api/v1/log/proof/consistency?from=9&to=3", &[]).status, 400);

    // One's own leaves only.
    assert_eq!(get(base, &bob, "/api/v1/log/leaf?source=external&id=e0", &[]).status, 404);

    // Cosignatures: a client's verified head is recorded and counted; its key is its own.
    let note = get(base, &ana, "/api/v1/log/checkpoint", &[]).json()["checkpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let (head, n) = open_checkpoint(&note, &key).unwrap();
    let witness = NoteSigner::generate("airlock-machine/test-ana").unwrap();
    let line = witness.cosign(&n.text, 1_765_000_000).unwrap();
    let body = json!({"checkpoint": note, "cosignature": line,
                      "key": witness.cosigner_verifier().to_string()});
    let r = post_json(base, &ana, "/api/v1/log/cosignature", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["witnesses"], 1);
    assert_eq!(r.json()["tree_size"], head.size);
    let r = post_json(base, &bob, "/api/v1/log/cosignature", &body);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.json()["reason"], "key_taken");
    let v = get(base, &bob, "/api/v1/log/checkpoint", &[]).json();
    assert_eq!(v["witnessed_size"], head.size, "{v}");
    assert_eq!(v["witnessed_by"], 1);
    // Any head's witnesses, by its size.
    let w = get(base, &bob, &format!("/api/v1/log/checkpoint?tree_size={}", head.size), &[]);
    assert_eq!(w.json()["witnesses"], 1, "{}", w.body);
    assert_eq!(w.json()["checkpoint"], note.as_str());
    assert_eq!(get(base, &bob, "/api/v1/log/checkpoint?tree_size=3", &[]).status, 404);
    assert_eq!(get(base, &bob, "/api/v1/log/checkpoint?size=3", &[]).status, 400);
    // A head the log never signed (a forged one under another key) is refused.
    let forger = NoteSigner::generate(&key.name).unwrap();
    let fake = Checkpoint { size: head.size + 1000, ..head.clone() };
    let fake_note = forger.sign_note(&fake.body()).unwrap();
    let fake_line = witness.cosign(&fake.body(), 1_765_000_000).unwrap();
    let r = post_json(
        base,
        &ana,
        "/api/v1/log/cosignature",
        &json!({"checkpoint": fake_note, "cosignature": fake_line,
                "key": witness.cosigner_verifier().to_string()}),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.json()["reason"], "unknown_checkpoint");
    // A cosignature that does not verify is a 400.
    let other = NoteSigner::generate("airlock-machine/other").unwrap();
    let r = post_json(
        base,
        &ana,
        "/api/v1/log/cosignature",
        &json!({"checkpoint": note, "cosignature": line,
                "key": other.cosigner_verifier().to_string()}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["reason"], "bad_cosignature");
}

fn get_bytes(base: &str, token: &str, path: &str) -> Vec<u8> {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--noproxy", "*", "--fail", "-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{base}{path}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{path}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
fn review_log_serves_verifiable_heads_proofs_and_tiles_embedded() {
    let world = World::new();
    log_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")), &[]);
}

#[test]
fn review_log_serves_verifiable_heads_proofs_and_tiles_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let key = world.tmp.path().join("log.key");
    let out = world
        .airlockd(world.tmp.path())
        .args(["review", "log-key", "init", "--out"])
        .args([&key])
        .run()
        .expect_code(0);
    let printed = NoteVerifier::parse(out.stdout().trim()).unwrap();
    // Never over an existing key: clients pinned it.
    world
        .airlockd(world.tmp.path())
        .args(["review", "log-key", "init", "--out"])
        .args([&key])
        .run()
        .expect_code(1);
    let key_arg = key.display().to_string();
    assert!(printed.name.starts_with("airlock-review/"), "{printed}");
    let store = StoreSel::Pg(db.runtime_url.clone());
    log_suite(&world, &store, &["--log-key", &key_arg]);

    // A server restarted with a new key re-signs the head at once under it (clients that
    // pin the new key must not be served a head they cannot open), and `time` never goes
    // back.
    let old = get_checkpoint_note(&world, &store, &["--log-key", &key_arg]);
    let key2 = world.tmp.path().join("log2.key");
    let out = world
        .airlockd(world.tmp.path())
        .args(["review", "log-key", "init", "--name", "airlock-review/second", "--out"])
        .args([&key2])
        .run()
        .expect_code(0);
    let second = NoteVerifier::parse(out.stdout().trim()).unwrap();
    let key2_arg = key2.display().to_string();
    let server = Server::start(&world, &store, &["--log-key", &key2_arg]);
    let ana = token_for(&world, &store, "ana@example.test");
    let (cp, _) = checkpoint_covering(&server.base, &ana, &second, 0);
    let (before, _) = open_checkpoint(&old, &printed).unwrap();
    assert_eq!((cp.size, cp.root), (before.size, before.root), "the same tree, re-signed");
    assert!(cp.time() >= before.time(), "{:?} < {:?}", cp.time(), before.time());
}

/// The latest signed note of a server started on `store` with `extra`.
fn get_checkpoint_note(world: &World, store: &StoreSel, extra: &[&str]) -> String {
    let server = Server::start(world, store, extra);
    let ana = token_for(world, store, "ana@example.test");
    let r = get(&server.base, &ana, "/api/v1/log/checkpoint", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["checkpoint"].as_str().unwrap().to_string()
}

#[test]
fn a_server_without_a_log_key_says_so() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    for path in ["/api/v1/log/key", "/api/v1/log/checkpoint"] {
        let r = get(&server.base, &ana, path, &[]);
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(r.json()["reason"], "no_log_key");
    }
}
