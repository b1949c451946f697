//! `GET /api/v1/export` on both stores through the real `airlockd review`: JSONL with one
//! header line describing the query, then every matching event (across many store pages) in
//! the events API's item shape; scoped like the listing (members: their own only); recorded
//! as an `airlock.review.export` event in the exporter's history.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};

fn lines(body: &str) -> Vec<Value> {
    body.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// The event lines of an export (between the header and the `end` line, which must close
/// it and count them), without the review log's `leaf` member (docs/evidence.md), so they
/// compare with the listing's items.
fn events_of(out: &[Value]) -> Vec<Value> {
    let end = &out.last().unwrap()["end"];
    let events: Vec<Value> = out[1..out.len() - 1]
        .iter()
        .filter(|l| l.get("missing").is_none())
        .map(|l| {
            let mut e = l.clone();
            e.as_object_mut().unwrap().remove("leaf");
            e
        })
        .collect();
    assert_eq!(end["events"], events.len(), "the end line counts the events: {end}");
    events
}

fn export_suite(world: &World, store: &StoreSel) {
    let ana = user_with_token(world, store, "ana@example.test", "member");
    let bob = user_with_token(world, store, "bob@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    // PostgreSQL has no data dir for `review init` to put a log key in: pass one.
    let key = world.tmp.path().join("log.key");
    let mut extra = Vec::new();
    if let StoreSel::Pg(_) = store {
        world
            .airlockd(world.tmp.path())
            .args(["review", "log-key", "init", "--out"])
            .args([&key])
            .run()
            .expect_code(0);
        extra = vec!["--log-key".to_string(), key.display().to_string()];
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = Server::start(world, store, &extra);
    // 2,500 of ana's (more than one store page of 1,000), with `ts` running backwards.
    for batch in 0..3 {
        let items: Vec<Value> = (batch * 1000..(batch * 1000 + 1000).min(2500))
            .map(|i| {
                json!({"id": format!("a{i}"), "source": "external", "type": "x",
                       "ts": format!("2026-03-04T09:{:02}:{:02}Z", 59 - i / 60 % 60, 59 - i % 60),
                       "payload": {"i": i, "pad": "p".repeat(100)}})
            })
            .collect();
        let f = write_file(world.tmp.path(), "a.json", json!(items).to_string().as_bytes());
        assert_eq!(post_events(&server.base, &ana, &f, "application/json", &[]).status, 200);
    }
    let f = write_file(
        world.tmp.path(),
        "b.json",
        json!([{"id": "b0", "source": "external", "type": "x", "ts": "2026-03-04T09:00:00Z",
                "payload": {"bob": true}}])
        .to_string()
        .as_bytes(),
    );
    assert_eq!(post_events(&server.base, &bob, &f, "application/json", &[]).status, 200);
    // The log sequences after commit (on PostgreSQL a sequencer does, after the answer), and an
    // export waits 2 s for a head covering it, which a loaded machine can outlast: wait for the
    // head first. This test is about what an export carries, not how fast the sequencer is.
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(60), || {
            let r = get(&server.base, &rev, "/api/v1/log/checkpoint", &[]);
            r.status == 200 && r.json()["tree_size"].as_u64() >= Some(2501)
        }),
        "the review log never covered the 2,501 events"
    );

    // A reviewer exports ana's history.
    let r = get(&server.base, &rev, "/api/v1/export?user=ana%40example.test", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("content-type: application/x-ndjson"));
    let out = lines(&r.body);
    let head = &out[0]["export"];
    let ana_id = out[1]["user_id"].as_str().unwrap().to_string();
    assert_eq!(head["format"], 1);
    assert_eq!(head["query"]["user"], ana_id.as_str());
    assert_eq!(head["query"]["order"], "received_at");
    assert!(head["exported_at"].as_str().unwrap().ends_with('Z'), "{head}");
    let rev_id =
        get(&server.base, &rev, "/api/v1/me", &[]).json()["id"].as_str().unwrap().to_string();
    assert_eq!(head["by"], rev_id.as_str());
    // Every event, in the events API's shape, in its order.
    let listed = all_events(&server.base, &rev, "&user=ana%40example.test");
    assert_eq!(listed.len(), 2500);
    assert_eq!(events_of(&out), listed, "the export's lines are the listing's items");
    // With the store's log key, every event carries its leaf and proof.
    assert!(head["log"]["checkpoint"].is_string(), "{head}");
    assert!(out[1..out.len() - 1].iter().all(|l| l["leaf"]["index"].is_u64()), "{}", out[1]);

    // order=ts and a filter apply as in the listing.
    let r = get(
        &server.base,
        &rev,
        "/api/v1/export?user=ana%40example.test&order=ts&ts_since=2026-03-04T09:30:00Z",
        &[],
    );
    assert_eq!(r.status, 200);
    let out = lines(&r.body);
    assert_eq!(out[0]["export"]["query"]["order"], "ts");
    let evs = events_of(&out);
    let ts: Vec<&str> = evs.iter().map(|e| e["ts"].as_str().unwrap()).collect();
    assert!(!ts.is_empty() && ts.windows(2).all(|w| w[0] <= w[1]), "sorted by ts");
    assert!(ts.iter().all(|t| *t >= "2026-03-04T09:30:00.000Z"), "{:?}", &ts[..3]);
    let want = listed.iter().filter(|e| e["ts"].as_str().unwrap() >= "2026-03-04T09:30").count();
    assert_eq!(ts.len(), want);

    // Members export only their own history.
    let r = get(&server.base, &bob, "/api/v1/export", &[]);
    assert_eq!(r.status, 200);
    let out = lines(&r.body);
    // The header, bob's event, the record of this export (written before it starts), and
    // the end line.
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(out[1]["id"], "b0");
    assert_eq!(out[2]["type"], "airlock.review.export");
    let r = get(&server.base, &bob, "/api/v1/export?user=ana%40example.test", &[]);
    assert_eq!(r.status, 403, "{}", r.body);
    // An export takes no `limit` and rejects bad values like the listing does.
    for q in ["limit=5", "order=soon", "ts_until=never"] {
        assert_eq!(get(&server.base, &rev, &format!("/api/v1/export?{q}"), &[]).status, 400, "{q}");
    }
    assert_eq!(get(&server.base, "alk_nope", "/api/v1/export", &[]).status, 401);

    // Each export is recorded in the exporter's history, naming what was exported.
    let mine = all_events(&server.base, &rev, "&user=rev%40example.test");
    let recs: Vec<&Value> = mine.iter().filter(|e| e["type"] == "airlock.review.export").collect();
    assert_eq!(recs.len(), 2, "two successful reviewer exports: {mine:?}");
    assert_eq!(recs[0]["payload"]["target_user"], ana_id.as_str());
    assert_eq!(recs[0]["payload"]["reader"], rev_id.as_str());
    let bob_own = all_events(&server.base, &bob, "");
    assert!(bob_own.iter().any(|e| e["type"] == "airlock.review.export"), "own exports too");
}

#[test]
fn export_streams_jsonl_scoped_and_recorded_embedded() {
    let world = World::new();
    export_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn export_streams_jsonl_scoped_and_recorded_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    export_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
