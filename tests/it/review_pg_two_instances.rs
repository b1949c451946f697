//! Two `airlockd review` instances on one PostgreSQL database behave as one store: the store
//! conformance suite passes with its calls alternating between two independent connection
//! pools (the review log's included: one instance holds the sequencer's lock, the other
//! answers `None`), and over HTTP two server processes — requests alternating between them — agree on
//! dedup (also for the same batch posted to both at once), `received_at` (the database's
//! clock), cursors, flags and flag states, and token revocation.

use crate::review_store::conformance;
use crate::review_support::*;
use crate::support::World;
use airlock::review::correlate::CorrelateScan;
use airlock::review::detect::session::SessionScan;
use airlock::review::store::postgres::PgStore;
use airlock::review::store::{
    EventPage, EventQuery, FlagAction, FlagAssignment, FlagQuery, IngestScan, LogHead, LogLeaf,
    NewCosignature, SessionTranscriptItems, Store, StoreError, StoredCheckpoint,
};
use airlock::review::{Flag, Inserted, Micros, NewEvent, NewFlag, Role, StoredEvent, User};
use airlock::tlog::Hash;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A store that sends each call to the next of two instances in turn.
struct Alternating {
    stores: [PgStore; 2],
    next: AtomicUsize,
}

impl Alternating {
    fn pick(&self) -> &PgStore {
        &self.stores[self.next.fetch_add(1, Ordering::Relaxed) % 2]
    }
}

impl Store for Alternating {
    async fn add_user(&self, email: &str, role: Role) -> Result<User, StoreError> {
        self.pick().add_user(email, role).await
    }
    async fn set_role(&self, user_id: &str, role: Role) -> Result<(), StoreError> {
        self.pick().set_role(user_id, role).await
    }
    async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        self.pick().list_users().await
    }
    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        self.pick().user_by_email(email).await
    }
    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        self.pick().user_by_id(id).await
    }
    async fn create_token(&self, t: &str, u: &str, h: [u8; 32]) -> Result<(), StoreError> {
        self.pick().create_token(t, u, h).await
    }
    async fn revoke_token(&self, t: &str) -> Result<bool, StoreError> {
        self.pick().revoke_token(t).await
    }
    async fn list_tokens(&self, u: &str) -> Result<Vec<(String, bool)>, StoreError> {
        self.pick().list_tokens(u).await
    }
    async fn authenticate(&self, h: [u8; 32]) -> Result<Option<User>, StoreError> {
        self.pick().authenticate(h).await
    }
    async fn insert_events(
        &self,
        u: &str,
        r: Micros,
        e: &[NewEvent],
    ) -> Result<Vec<Inserted>, StoreError> {
        self.pick().insert_events(u, r, e).await
    }
    async fn ingest(
        &self,
        u: &str,
        r: Micros,
        e: &[NewEvent],
        scan: Arc<dyn IngestScan>,
    ) -> Result<Vec<Inserted>, StoreError> {
        self.pick().ingest(u, r, e, scan).await
    }
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        self.pick().query_events(q).await
    }
    async fn query_event_page(&self, q: &EventQuery) -> Result<EventPage, StoreError> {
        self.pick().query_event_page(q).await
    }
    async fn scan_session(&self, scan: SessionScan) -> Result<SessionScan, StoreError> {
        self.pick().scan_session(scan).await
    }
    async fn scan_correlate(&self, scan: CorrelateScan) -> Result<CorrelateScan, StoreError> {
        self.pick().scan_correlate(scan).await
    }
    async fn session_events(&self, u: &str, s: &str) -> Result<Vec<StoredEvent>, StoreError> {
        self.pick().session_events(u, s).await
    }
    async fn session_transcript_items(
        &self,
        u: &str,
        s: &str,
        max: usize,
    ) -> Result<SessionTranscriptItems, StoreError> {
        self.pick().session_transcript_items(u, s, max).await
    }
    async fn transcript_line_counts(
        &self,
        u: &str,
        s: &str,
        files: &[String],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.pick().transcript_line_counts(u, s, files).await
    }
    async fn person_activity(
        &self,
        u: &[String],
        week: Micros,
    ) -> Result<Vec<airlock::review::store::PersonActivity>, StoreError> {
        self.pick().person_activity(u, week).await
    }
    async fn hour_counts(
        &self,
        u: &str,
        start: Micros,
        hours: u32,
    ) -> Result<Vec<airlock::review::store::HourCount>, StoreError> {
        self.pick().hour_counts(u, start, hours).await
    }
    async fn event_flag_counts(&self, pks: &[i64]) -> Result<Vec<(i64, u64)>, StoreError> {
        self.pick().event_flag_counts(pks).await
    }
    async fn insert_flags(&self, f: &[NewFlag]) -> Result<(), StoreError> {
        self.pick().insert_flags(f).await
    }
    async fn list_flags(&self, q: &FlagQuery) -> Result<Vec<(i64, Flag)>, StoreError> {
        self.pick().list_flags(q).await
    }
    async fn get_flag(&self, id: &str) -> Result<Option<Flag>, StoreError> {
        self.pick().get_flag(id).await
    }
    async fn append_flag_state(&self, a: &FlagAction<'_>) -> Result<bool, StoreError> {
        self.pick().append_flag_state(a).await
    }
    async fn assign_flag(&self, a: &FlagAssignment<'_>) -> Result<bool, StoreError> {
        self.pick().assign_flag(a).await
    }
    async fn open_gate(
        &self,
        g: &airlock::review::gates::NewGate,
        caps: airlock::review::store::GateCaps,
    ) -> Result<airlock::review::store::Opened, StoreError> {
        self.pick().open_gate(g, caps).await
    }
    async fn get_gate(&self, id: &str) -> Result<Option<airlock::review::gates::Gate>, StoreError> {
        self.pick().get_gate(id).await
    }
    async fn list_gates(
        &self,
        q: &airlock::review::gates::GateQuery,
    ) -> Result<Vec<airlock::review::gates::Gate>, StoreError> {
        self.pick().list_gates(q).await
    }
    async fn decide_gate(
        &self,
        d: &airlock::review::gates::DecisionRequest<'_>,
    ) -> Result<airlock::review::gates::Decided, StoreError> {
        self.pick().decide_gate(d).await
    }
    async fn expire_gates(
        &self,
        max: usize,
    ) -> Result<Vec<airlock::review::gates::Gate>, StoreError> {
        self.pick().expire_gates(max).await
    }
    async fn log_sequence(&self, max: usize) -> Result<Option<LogHead>, StoreError> {
        self.pick().log_sequence(max).await
    }
    async fn log_head(&self) -> Result<LogHead, StoreError> {
        self.pick().log_head().await
    }
    async fn log_tier(&self, level: u8, start: u64, end: u64) -> Result<Vec<Hash>, StoreError> {
        self.pick().log_tier(level, start, end).await
    }
    async fn log_leaves(&self, pks: &[i64]) -> Result<Vec<LogLeaf>, StoreError> {
        self.pick().log_leaves(pks).await
    }
    async fn log_event_leaf(
        &self,
        u: &str,
        source: &str,
        id: &str,
    ) -> Result<Option<(i64, Micros, Option<LogLeaf>)>, StoreError> {
        self.pick().log_event_leaf(u, source, id).await
    }
    async fn log_orphans(&self, u: &str, limit: u32) -> Result<Vec<LogLeaf>, StoreError> {
        self.pick().log_orphans(u, limit).await
    }
    async fn log_add_checkpoint(&self, cp: &StoredCheckpoint) -> Result<(), StoreError> {
        self.pick().log_add_checkpoint(cp).await
    }
    async fn log_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.pick().log_checkpoint(size).await
    }
    async fn log_add_cosignature(&self, c: &NewCosignature<'_>) -> Result<u64, StoreError> {
        self.pick().log_add_cosignature(c).await
    }
    async fn log_witnesses(&self, size: u64) -> Result<u64, StoreError> {
        self.pick().log_witnesses(size).await
    }
    async fn log_witnessed(&self) -> Result<Option<(u64, u64)>, StoreError> {
        self.pick().log_witnessed().await
    }
}

#[test]
fn pg_two_instances_pass_the_conformance_suite_alternating() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = Alternating {
            stores: [
                PgStore::connect(&db.admin_url, 1).await.unwrap(),
                PgStore::connect(&db.admin_url, 1).await.unwrap(),
            ],
            next: AtomicUsize::new(0),
        };
        let s = Alternating {
            stores: [
                PgStore::connect(&db.runtime_url, 2).await.unwrap(),
                PgStore::connect(&db.runtime_url, 2).await.unwrap(),
            ],
            next: AtomicUsize::new(1),
        };
        conformance(&admin, &s, false).await;
    });
}

/// The fixture transcript line whose tool result carries a (test) Stripe key.
fn secret_line() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/transcripts/claude-happy-path.jsonl"),
    )
    .unwrap();
    let line = text.lines().find(|l| l.contains("sk_test_")).unwrap();
    claude(serde_json::from_str(line).unwrap())
}

fn results(r: &Http) -> Vec<Value> {
    assert!(r.status == 200 || r.status == 207, "{} {}", r.status, r.body);
    r.json()["results"].as_array().unwrap().clone()
}

fn act(base: &str, token: &str, flag: &str, action: &str) -> Http {
    curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        "-d",
        &json!({"action": action}).to_string(),
        &format!("{base}/api/v1/flags/{flag}"),
    ])
}

#[test]
fn pg_two_servers_on_one_database_agree() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let rev = user_with_token(&world, &store, "rev@example.test", "reviewer");
    let a = Server::start(&world, &store, &[]);
    let b = Server::start(&world, &store, &[]);
    let servers = [&a.base, &b.base];
    let dir = world.tmp.path();

    // A batch stored through A is a duplicate through B, with A's received_at.
    let first: Vec<Value> =
        (0..6).map(|i| egress(&format!("eg-{i}"), "example.test", true)).collect();
    let body = write_file(dir, "first.ndjson", &ndjson(&first));
    let on_a = results(&post_events(&a.base, &ana, &body, "application/x-ndjson", &[]));
    assert!(on_a.iter().all(|r| r["status"] == "created"), "{on_a:?}");
    let on_b = results(&post_events(&b.base, &ana, &body, "application/x-ndjson", &[]));
    for (x, y) in on_a.iter().zip(&on_b) {
        assert_eq!(y["status"], "duplicate", "{y}");
        assert_eq!(x["received_at"], y["received_at"]);
    }

    // The same new batch posted to both at once: each item is created exactly once.
    let both: Vec<Value> =
        (0..200).map(|i| egress(&format!("race-{i}"), "example.test", true)).collect();
    let body = write_file(dir, "race.ndjson", &ndjson(&both));
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| post_events(&a.base, &ana, &body, "application/x-ndjson", &[]));
        let tb = s.spawn(|| post_events(&b.base, &ana, &body, "application/x-ndjson", &[]));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let (ra, rb) = (results(&ra), results(&rb));
    for (x, y) in ra.iter().zip(&rb) {
        let created = [x, y].iter().filter(|r| r["status"] == "created").count();
        let dup = [x, y].iter().filter(|r| r["status"] == "duplicate").count();
        assert_eq!((created, dup), (1, 1), "{x} / {y}");
        assert_eq!(x["received_at"], y["received_at"], "one stored copy, one received_at");
    }

    // Cursor pagination alternating between the servers sees every event once, in order.
    let mut seen: Vec<i64> = Vec::new();
    let mut cursor: Option<String> = None;
    for k in 0.. {
        let mut path = "/api/v1/events?limit=7".to_string();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = get(servers[k % 2], &ana, &path, &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        seen.extend(v["events"].as_array().unwrap().iter().map(|e| e["pk"].as_i64().unwrap()));
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 206);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "pk order across servers");

    // A flag raised through B is seen, and acted on, through A; the state is shared.
    let body = write_file(dir, "secret.ndjson", &ndjson(&[secret_line()]));
    let r = results(&post_events(&b.base, &ana, &body, "application/x-ndjson", &[]));
    assert_eq!(r[0]["status"], "created", "{r:?}");
    let flags = get(&a.base, &rev, "/api/v1/flags", &[]).json();
    let flag = flags["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rule_id"] == "secret.stripe-key")
        .unwrap_or_else(|| panic!("no flag through A: {flags}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let acted = act(&a.base, &rev, &flag, "acknowledge");
    assert_eq!(acted.status, 200, "{}", acted.body);
    let state_on = |base: &str| -> BTreeMap<String, Value> {
        get(base, &rev, "/api/v1/flags", &[]).json()["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["id"].as_str().unwrap().to_string(), f["state"].clone()))
            .collect()
    };
    assert_eq!(state_on(&b.base)[&flag], "acknowledged");
    assert_eq!(act(&b.base, &rev, &flag, "resolve").status, 200);
    assert_eq!(state_on(&a.base)[&flag], "resolved");
    // A member is refused on both (by the server, and on PostgreSQL by the function too).
    for s in servers {
        assert_eq!(act(s, &ana, &flag, "dismiss").status, 403);
    }

    // A token revoked with `airlockd admin` stops working on both at once.
    world
        .airlockd(dir)
        .args(["admin", "token", "revoke", "--user", "ana@example.test"])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    for s in servers {
        assert_eq!(get(s, &ana, "/api/v1/me", &[]).status, 401);
    }
    assert_eq!(get(&b.base, &rev, "/api/v1/me", &[]).status, 200);
}
