//! The store conformance suite, run against the embedded store and real PostgreSQL
//! (a fresh database per test; the insert-only checks connect as the runtime role).

use crate::review_support::PgDb;
use crate::support::World;
use airlock::review::store::postgres::{self, PgStore};
use airlock::review::store::sqlite::SqliteStore;
use airlock::review::store::{
    EventOrder, EventQuery, FlagAction, FlagQuery, IngestScan, LogHead, NewCosignature, Store,
    StoreError, StoredCheckpoint,
};
use airlock::review::{
    FlagState, Inserted, Micros, NewEvent, NewFlag, Role, Severity, Source, StoredEvent, token,
};
use airlock::tlog::merkle::{fold, root};
use airlock::tlog::{EventLeaf, Hash, sha256};
use std::sync::Arc;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

fn ev(source: Source, id: &str, session: Option<&str>, seq: Option<i64>) -> NewEvent {
    NewEvent {
        source,
        id: id.into(),
        kind: "connect".into(),
        ts: 1_772_615_525_118_000,
        session: session.map(str::to_string),
        seq,
        boot: Some("boot-1".into()),
        payload: format!(
            r#"{{"id":"{id}","big":12345678901234567890123,"user_id":"not-compared"}}"#
        ),
        airlock_session: None,
        file: None,
        offset: None,
    }
}

const T0: Micros = 1_772_615_600_000_000; // 2026-03-04

/// The contract every store must meet. `admin` is the store as `airlockd admin` opens it
/// (users, roles, tokens; PostgreSQL's admin role), `s` as the server does (the runtime role);
/// for the embedded store both are the same. `sequenced_at_ingest`: the store appends an
/// ingest's leaves in the ingest's transaction (the embedded store), so results carry them.
pub(crate) async fn conformance<S: Store>(admin: &S, s: &S, sequenced_at_ingest: bool) {
    // Users and roles (role changes are appended; the latest wins).
    let ana = admin.add_user("ana@example.test", Role::Member).await.unwrap();
    let bob = admin.add_user("bob@example.test", Role::Member).await.unwrap();
    assert!(matches!(
        admin.add_user("ana@example.test", Role::Admin).await,
        Err(StoreError::Conflict(_))
    ));
    admin.set_role(&bob.id, Role::Reviewer).await.unwrap();
    admin.set_role(&bob.id, Role::Admin).await.unwrap();
    assert_eq!(s.user_by_email("bob@example.test").await.unwrap().unwrap().role, Role::Admin);
    assert!(s.user_by_email("nobody@example.test").await.unwrap().is_none());
    let users = s.list_users().await.unwrap();
    assert_eq!(
        users.iter().map(|u| u.email.as_str()).collect::<Vec<_>>(),
        ["ana@example.test", "bob@example.test"]
    );
    assert!(matches!(
        admin.set_role("no-such-id", Role::Admin).await,
        Err(StoreError::NotFound(_))
    ));

    // Tokens: stored by hash, revocation appended. Real secrets: PostgreSQL's flag-state
    // function hashes the presented one itself.
    let (t1, t2, tb) = ("alk_conformance-1", "alk_conformance-2", "alk_conformance-bob");
    let (h1, h2) = (token::hash(t1), token::hash(t2));
    admin.create_token("tok1", &ana.id, h1).await.unwrap();
    admin.create_token("tok2", &ana.id, h2).await.unwrap();
    admin.create_token("tokb", &bob.id, token::hash(tb)).await.unwrap();
    assert_eq!(s.authenticate(h1).await.unwrap().unwrap().id, ana.id);
    assert!(s.authenticate([9u8; 32]).await.unwrap().is_none());
    assert!(admin.revoke_token("tok1").await.unwrap());
    assert!(!admin.revoke_token("nope").await.unwrap());
    assert!(s.authenticate(h1).await.unwrap().is_none());
    assert!(s.authenticate(h2).await.unwrap().is_some());
    assert_eq!(
        s.list_tokens(&ana.id).await.unwrap(),
        vec![("tok1".into(), true), ("tok2".into(), false)]
    );

    // Insert with dedup on (user, source, id); repeats inside one batch report the first.
    let batch = vec![
        ev(Source::Egress, "e1", Some("s1"), Some(1)),
        ev(Source::Egress, "e2", Some("s1"), Some(2)),
        ev(Source::Claude, "e1", Some("s1"), None),
        ev(Source::Egress, "e1", Some("s1"), Some(1)),
    ];
    let r = s.insert_events(&ana.id, T0, &batch).await.unwrap();
    assert_eq!(r.iter().map(|x| x.created).collect::<Vec<_>>(), [true, true, true, false]);
    assert_eq!(r[3].pk, r[0].pk);
    // One received_at per batch: the server's clock (embedded) or the database's (PostgreSQL,
    // which ignores the argument).
    let t0 = r[0].received_at;
    assert!(r.iter().all(|x| x.received_at == t0));
    let again = s.insert_events(&ana.id, T0 + 5_000_000, &batch[..3]).await.unwrap();
    assert!(
        again.iter().all(|x| !x.created && x.received_at == t0),
        "duplicates keep the original received_at"
    );
    // Same key under another user is a different event (received strictly later: the sleep
    // only orders the database clock's two readings).
    std::thread::sleep(std::time::Duration::from_millis(2));
    let other = s.insert_events(&bob.id, T0 + 1, &batch[..1]).await.unwrap();
    assert!(other[0].created);
    let t1 = other[0].received_at;
    assert!(t1 > t0, "{t1} > {t0}");

    // Reads: stored verbatim, filters, cursor pagination.
    let all = s
        .query_events(&EventQuery {
            user_id: Some(ana.id.clone()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].payload, batch[0].payload, "payload verbatim (big numbers, foreign ids)");
    assert_eq!(all[0].seq, Some(1));
    assert_eq!(all[0].boot.as_deref(), Some("boot-1"));
    assert_eq!(all[0].ts, batch[0].ts);
    let claude = s
        .query_events(&EventQuery {
            source: Some(Source::Claude),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(claude.len(), 1);
    let page1 = s
        .query_events(&EventQuery { user_id: Some(ana.id.clone()), limit: 2, ..Default::default() })
        .await
        .unwrap();
    let page2 = s
        .query_events(&EventQuery {
            user_id: Some(ana.id.clone()),
            limit: 2,
            after: Some(page1[1].pk),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page1.len() + page2.len(), 3);
    assert!(page2[0].pk > page1[1].pk);
    let later = s
        .query_events(&EventQuery { since: Some(t1), limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(later.len(), 1, "time range on received_at");
    assert_eq!(later[0].user_id, bob.id);
    let before = s
        .query_events(&EventQuery { until: Some(t1), limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(before.len(), 3);
    let sess = s.session_events(&ana.id, "s1").await.unwrap();
    assert_eq!(sess.len(), 3);
    assert!(s.session_events(&bob.id, "s1").await.unwrap().len() == 1);

    // Flags: idempotent by id, linked events, appended states.
    let flag = NewFlag {
        id: "f1".into(),
        rule_id: "secret.stripe-key".into(),
        title: "t".into(),
        severity: Severity::High,
        user_id: ana.id.clone(),
        session: Some("s1".into()),
        detail: "d".into(),
        event_pks: vec![r[0].pk, r[1].pk],
    };
    s.insert_flags(std::slice::from_ref(&flag)).await.unwrap();
    s.insert_flags(std::slice::from_ref(&flag)).await.unwrap();
    let flags = s.list_flags(&FlagQuery { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(flags.len(), 1);
    assert_eq!(flags[0].1.state, FlagState::Open);
    assert_eq!(flags[0].1.event_pks, vec![r[0].pk, r[1].pk]);
    let flagged = s
        .query_events(&EventQuery { flagged: Some(true), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(flagged.len(), 2);
    let unflagged = s
        .query_events(&EventQuery {
            flagged: Some(false),
            user_id: Some(ana.id.clone()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(unflagged.len(), 1);
    assert!(
        s.append_flag_state(&FlagAction {
            flag_id: "f1",
            state: FlagState::Acknowledged,
            note: Some("seen"),
            actor: &bob.id,
            self_action: false,
            secret: tb,
            at: T0
        })
        .await
        .unwrap()
    );
    assert!(
        s.append_flag_state(&FlagAction {
            flag_id: "f1",
            state: FlagState::Resolved,
            note: None,
            actor: &bob.id,
            self_action: false,
            secret: tb,
            at: T0 + 1
        })
        .await
        .unwrap()
    );
    assert!(
        !s.append_flag_state(&FlagAction {
            flag_id: "nope",
            state: FlagState::Resolved,
            note: None,
            actor: &bob.id,
            self_action: false,
            secret: tb,
            at: T0
        })
        .await
        .unwrap()
    );
    let f = s.get_flag("f1").await.unwrap().unwrap();
    assert_eq!(f.state, FlagState::Resolved);
    assert_eq!(f.note, None);
    assert!(
        s.list_flags(&FlagQuery { state: Some(FlagState::Open), limit: 10, ..Default::default() })
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.list_flags(&FlagQuery {
            state: Some(FlagState::Resolved),
            user_id: Some(ana.id.clone()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .len(),
        1
    );
    assert!(
        s.list_flags(&FlagQuery { user_id: Some(bob.id.clone()), limit: 10, ..Default::default() })
            .await
            .unwrap()
            .is_empty()
    );
    transcripts_conformance(admin, s, &ana.id, &bob.id).await;
    console_reads_conformance(admin, s).await;
    gates_conformance(s, &ana, t2, &bob, tb).await;
    log_conformance(s, sequenced_at_ingest, &ana.id, &bob.id).await;
}

/// Detection that finds nothing (for `Store::ingest`).
struct NoScan;

impl IngestScan for NoScan {
    fn batch_flags(&self, _: &[Inserted]) -> Vec<NewFlag> {
        Vec::new()
    }
    fn ended_sessions(&self, _: &[Inserted]) -> Vec<String> {
        Vec::new()
    }
    fn session_flags(&self, _: airlock::review::detect::session::SessionScan) -> Vec<NewFlag> {
        Vec::new()
    }
}

/// Sequences until a pass appends nothing; an instance without the sequencer's lock answers
/// `None` and is asked again (the alternating wrapper asks two instances in turn).
pub(crate) async fn sequence_all<S: Store>(s: &S) -> LogHead {
    let mut last = None;
    for _ in 0..500 {
        match s.log_sequence(100).await.unwrap() {
            Some(h) if h.appended == 0 => return h,
            Some(h) => last = Some(h),
            None => {}
        }
    }
    panic!("the log never settled: {last:?}");
}

/// Every stored event, in `pk` order.
async fn every_event<S: Store>(s: &S) -> Vec<StoredEvent> {
    let mut out: Vec<StoredEvent> = Vec::new();
    loop {
        let q = EventQuery { after: out.last().map(|e| e.pk), limit: 500, ..Default::default() };
        let page = s.query_events(&q).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// The leaf hash of a stored event, rebuilt from its row (docs/evidence.md "Leaves").
fn leaf_of(e: &StoredEvent) -> Hash {
    EventLeaf {
        user_id: &e.user_id,
        source: e.source.as_str(),
        id: &e.id,
        received_at: e.received_at,
        payload_sha256: sha256(e.payload.as_bytes()),
    }
    .hash()
}

/// Sequences everything and checks the stored tree against the stored events: one leaf per
/// event, indices gapless from 0 (`in_pk_order`: in `pk` order), each leaf rebuilt from its
/// event's row, tier 0 the leaf hashes, tier 1 their folds per 256, the root RFC 9162's over
/// the leaves, and `log_head` the same head. Returns the head and the leaf hashes.
pub(crate) async fn check_log<S: Store>(s: &S, in_pk_order: bool) -> (LogHead, Vec<Hash>) {
    let head = sequence_all(s).await;
    let events = every_event(s).await;
    assert_eq!(head.size, events.len() as u64, "one leaf per event");
    let pks: Vec<i64> = events.iter().map(|e| e.pk).collect();
    let leaves = s.log_leaves(&pks).await.unwrap();
    assert_eq!(leaves.len(), events.len(), "every event has its leaf");
    let mut indices: Vec<u64> = leaves.iter().map(|l| l.index).collect();
    if in_pk_order {
        assert!(indices.windows(2).all(|w| w[0] < w[1]), "leaves in pk order: {indices:?}");
    }
    indices.sort();
    assert!(indices.iter().copied().eq(0..head.size), "indices gapless from 0");
    for (e, l) in events.iter().zip(&leaves) {
        assert_eq!(l.event_pk, e.pk);
        assert_eq!(
            (l.user_id.as_str(), l.source.as_str(), l.id.as_str(), l.received_at),
            (e.user_id.as_str(), e.source.as_str(), e.id.as_str(), e.received_at),
        );
        assert_eq!(l.payload_sha256, sha256(e.payload.as_bytes()));
        assert_eq!(l.hash, leaf_of(e), "leaf {} of event {}", l.index, e.pk);
    }
    let hashes = s.log_tier(0, 0, head.size + 10).await.unwrap();
    let mut by_index = leaves.clone();
    by_index.sort_by_key(|l| l.index);
    assert_eq!(hashes, by_index.iter().map(|l| l.hash).collect::<Vec<_>>(), "tier 0");
    let tier1 = s.log_tier(1, 0, u64::MAX).await.unwrap();
    assert_eq!(tier1.len() as u64, head.size / 256, "complete tier-1 hashes");
    for (k, h) in tier1.iter().enumerate() {
        assert_eq!(*h, fold(&hashes[256 * k..256 * (k + 1)]), "tier 1 hash {k}");
    }
    assert_eq!(head.root, root(&hashes), "RFC 9162 root over the leaves");
    assert_eq!(s.log_head().await.unwrap(), LogHead { appended: 0, ..head });
    (head, hashes)
}

/// The review log (docs/evidence.md) agrees on both stores: leaves for every stored event
/// (gates' included) rebuilt from the rows, receipts' indices where the store sequences at
/// ingest, duplicates keeping their original's leaf and conflicts getting their own, tiers
/// past 256 leaves, the event lookup, checkpoints and cosignatures (a key is its first
/// poster's).
async fn log_conformance<S: Store>(s: &S, at_ingest: bool, ana: &str, bob: &str) {
    assert_eq!(s.log_witnessed().await.unwrap(), None);
    assert_eq!(s.log_checkpoint(None).await.unwrap(), None);
    let (head, _) = check_log(s, true).await;

    // Receipts: the embedded store answers each created item's index at once.
    let log_ev = |id: &str| ev(Source::External, id, None, None);
    let batch: Vec<NewEvent> = (0..3).map(|i| log_ev(&format!("log-{i}"))).collect();
    let r = s.insert_events(ana, T0, &batch).await.unwrap();
    let scan: Arc<dyn IngestScan> = Arc::new(NoScan);
    let r2 = s.ingest(ana, T0, &[log_ev("log-3")], scan).await.unwrap();
    let got: Vec<Option<u64>> = r.iter().chain(&r2).map(|i| i.leaf_index).collect();
    if at_ingest {
        let want: Vec<Option<u64>> = (head.size..head.size + 4).map(Some).collect();
        assert_eq!(got, want, "indices follow the head, in pk order");
    } else {
        assert_eq!(got, [None; 4], "sequenced after commit");
        let (pk, _, leaf) = s.log_event_leaf(ana, "external", "log-3").await.unwrap().unwrap();
        assert_eq!((pk, leaf), (r2[0].pk, None), "not sequenced yet");
    }
    let (head, _) = check_log(s, true).await;

    // A duplicate keeps its original's leaf (no new one); a conflict gets its own.
    let dup = s.insert_events(ana, T0, &batch[..1]).await.unwrap();
    assert!(!dup[0].created);
    assert_eq!(dup[0].leaf_index, r[0].leaf_index);
    let changed = NewEvent { payload: r#"{"changed":true}"#.into(), ..batch[0].clone() };
    let c = s.insert_events(ana, T0, &[changed]).await.unwrap();
    assert!(c[0].created && c[0].conflict.is_some(), "{c:?}");
    let (after, _) = check_log(s, true).await;
    assert_eq!(after.size, head.size + 1, "the duplicate added no leaf, the conflict one");
    let leaves = s.log_leaves(&[r[0].pk, c[0].pk, -1]).await.unwrap();
    assert_eq!(leaves.len(), 2, "an event without a leaf is left out");
    assert_eq!((leaves[0].id.as_str(), leaves[1].id.as_str()), ("log-0", "log-0"));
    assert_ne!(leaves[0].hash, leaves[1].hash);
    assert_eq!(leaves[1].index, head.size);
    if at_ingest {
        assert_eq!(c[0].leaf_index, Some(head.size));
    }
    // The lookup by key names the original, with its leaf.
    let (pk, received_at, leaf) =
        s.log_event_leaf(ana, "external", "log-0").await.unwrap().unwrap();
    assert_eq!((pk, received_at), (r[0].pk, r[0].received_at));
    assert_eq!(leaf.as_ref(), Some(&leaves[0]));
    assert_eq!(leaf.map(|l| l.received_at), Some(r[0].received_at));
    assert!(s.log_event_leaf(bob, "external", "log-0").await.unwrap().is_none());
    assert!(s.log_event_leaf(ana, "egress", "log-0").await.unwrap().is_none());

    // Past 256 leaves: tier-1 hashes are stored and fold their 256 leaves.
    for k in 0..3 {
        let bulk: Vec<NewEvent> = (0..200).map(|i| log_ev(&format!("bulk-{k}-{i}"))).collect();
        s.insert_events(bob, T0, &bulk).await.unwrap();
    }
    let (head, hashes) = check_log(s, true).await;
    assert!(head.size >= 600 && head.size / 256 >= 2, "{head:?}");
    assert_eq!(s.log_tier(0, 250, 260).await.unwrap(), hashes[250..260].to_vec());
    assert!(s.log_tier(0, head.size, head.size + 5).await.unwrap().is_empty());
    assert!(s.log_tier(0, 7, 7).await.unwrap().is_empty());
    assert!(s.log_tier(2, 0, 10).await.unwrap().is_empty());
    assert!(s.log_orphans(ana, 10).await.unwrap().is_empty(), "no event row is gone");

    // Checkpoints: the latest, or the latest of a size.
    let cp = |size: u64, root: Hash, at: Micros| StoredCheckpoint {
        size,
        root,
        note: format!(
            "airlock-review/test
{size}
{at}

— sig
"
        ),
        signed_at: at,
    };
    let small = [7u8; 32];
    s.log_add_checkpoint(&cp(3, small, 10)).await.unwrap();
    s.log_add_checkpoint(&cp(3, small, 20)).await.unwrap();
    s.log_add_checkpoint(&cp(head.size, head.root, 30)).await.unwrap();
    assert_eq!(s.log_checkpoint(None).await.unwrap(), Some(cp(head.size, head.root, 30)));
    assert_eq!(s.log_checkpoint(Some(3)).await.unwrap(), Some(cp(3, small, 20)));
    assert_eq!(s.log_checkpoint(Some(4)).await.unwrap(), None);

    // Cosignatures: distinct keys per tree size; a key is its first poster's.
    let cosig = |user_id, key, size, root| NewCosignature {
        user_id,
        key,
        size,
        root,
        time: 1_765_000_000,
        line: "— witness AAAA
",
        at: T0,
    };
    let (k1, k2) = ("ana-laptop+0a0b0c0d+AAAA", "bob-ci+01020304+BBBB");
    assert_eq!(s.log_add_cosignature(&cosig(ana, k1, head.size, head.root)).await.unwrap(), 1);
    assert_eq!(s.log_add_cosignature(&cosig(ana, k1, head.size, head.root)).await.unwrap(), 1);
    assert_eq!(s.log_add_cosignature(&cosig(bob, k2, head.size, head.root)).await.unwrap(), 2);
    let taken = s.log_add_cosignature(&cosig(bob, k1, 3, small)).await;
    assert!(matches!(taken, Err(StoreError::Conflict(_))), "key_taken: {taken:?}");
    assert_eq!(s.log_witnesses(3).await.unwrap(), 0, "the refused cosignature left nothing");
    assert_eq!(s.log_add_cosignature(&cosig(ana, k1, 3, small)).await.unwrap(), 1);
    assert_eq!(s.log_witnesses(head.size).await.unwrap(), 2);
    assert_eq!(s.log_witnesses(4).await.unwrap(), 0);
    assert_eq!(s.log_witnessed().await.unwrap(), Some((head.size, 2)));
}

/// Action gates agree on both stores: opening (with its `gate.requested` event, under the
/// pending caps), reading and listing by state, one decision per gate bound to the digest
/// (with its event), and the expiry sweep writing `expired` once.
async fn gates_conformance<S: Store>(
    s: &S,
    ana: &airlock::review::User,
    ana_secret: &str,
    bob: &airlock::review::User,
    bob_secret: &str,
) {
    use airlock::review::gates::{
        Decided, DecisionRequest, GateKind, GateQuery, GateState, NewGate, Verdict,
    };
    use airlock::review::store::{GateCaps, Opened};
    let new_gate = |id: &str, session: &str, timeout_ms: i64| {
        let action = airlock::gate::EgressAction {
            session,
            attempt: id,
            method: "CONNECT",
            host: "api.pay.test",
            port: 443,
            request: None,
        }
        .canonical();
        NewGate {
            id: id.into(),
            user_id: ana.id.clone(),
            kind: GateKind::Egress,
            session: Some(session.into()),
            repo: Some("payments".into()),
            method: Some("CONNECT".into()),
            host: Some("api.pay.test".into()),
            port: Some(443),
            request: None,
            digest: airlock::gate::digest(&action),
            action,
            severity: airlock::gate::Severity::Medium,
            rule: Some("api.pay.test".into()),
            layer: Some("user".into()),
            policy: Some("~/.airlock/config.toml".into()),
            local_id: Some("g000001-x".into()),
            context: Some(r#"{"why":"refund"}"#.into()),
            self_approve: false,
            timeout_ms,
        }
    };
    let caps = GateCaps { per_session: 2, per_user: 3 };
    let open = |g: NewGate| async move { s.open_gate(&g, caps).await.unwrap() };
    let Opened::Gate(g1) = open(new_gate("gt_1", "GS1", 60_000)).await else { panic!("g1") };
    assert_eq!((g1.user_email.as_str(), g1.gate.port), ("ana@example.test", Some(443)));
    assert_eq!(g1.deadline - g1.requested_at, 60_000_000, "the deadline is the timeout after");
    assert!(g1.decision.is_none());
    let Opened::Gate(_) = open(new_gate("gt_2", "GS1", 60_000)).await else { panic!("g2") };
    // The session's cap, then the user's, refuse without storing anything.
    assert_eq!(open(new_gate("gt_3", "GS1", 60_000)).await, Opened::SessionLimit(2));
    let Opened::Gate(_) = open(new_gate("gt_4", "GS2", 1_000)).await else { panic!("g4") };
    assert_eq!(open(new_gate("gt_5", "GS3", 60_000)).await, Opened::UserLimit(3));
    assert!(s.get_gate("gt_3").await.unwrap().is_none());
    assert!(s.get_gate("gt_nope").await.unwrap().is_none());
    let got = s.get_gate("gt_1").await.unwrap().unwrap();
    assert_eq!(got, *g1, "read back as opened");

    // Decisions: bound to the digest, once.
    let decide =
        |id: &'static str, verdict, digest: Option<&'static str>, actor, secret| DecisionRequest {
            gate_id: id,
            verdict,
            note: Some("looks right"),
            actor,
            self_decided: false,
            override_requested: false,
            step_up: false,
            digest,
            secret,
        };
    let wrong = decide("gt_1", Verdict::Approve, Some("sha256:00"), bob, bob_secret);
    assert!(matches!(s.decide_gate(&wrong).await.unwrap(), Decided::Digest(_)));
    let right = DecisionRequest {
        digest: Some(g1.gate.digest.as_str()),
        ..decide("gt_1", Verdict::Approve, None, bob, bob_secret)
    };
    let Decided::Done(d1) = s.decide_gate(&right).await.unwrap() else { panic!("decided") };
    let dec = d1.decision.clone().unwrap();
    assert_eq!(dec.state, GateState::Approved);
    assert_eq!(
        (dec.actor.as_deref(), dec.actor_email.as_deref()),
        (Some(bob.id.as_str()), Some("bob@example.test"))
    );
    assert_eq!((dec.note.as_deref(), dec.self_decided), (Some("looks right"), false));
    assert!(matches!(s.decide_gate(&right).await.unwrap(), Decided::NotPending(_)));
    let deny = decide("gt_1", Verdict::Deny, None, bob, bob_secret);
    assert!(matches!(s.decide_gate(&deny).await.unwrap(), Decided::NotPending(_)));
    let none = decide("gt_nope", Verdict::Deny, None, bob, bob_secret);
    assert_eq!(s.decide_gate(&none).await.unwrap(), Decided::NoGate);
    // The requester withdraws their own.
    let abandon = DecisionRequest {
        self_decided: true,
        ..decide("gt_2", Verdict::Abandon, None, ana, ana_secret)
    };
    let Decided::Done(d2) = s.decide_gate(&abandon).await.unwrap() else { panic!("abandon") };
    let dec = d2.decision.unwrap();
    assert_eq!((dec.state, dec.self_decided), (GateState::Abandoned, true));

    // gt_4 expires (1 s), and the sweep writes it once.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let q =
        |state| GateQuery { user_id: Some(ana.id.clone()), state, limit: 10, ..Default::default() };
    let ids =
        |v: Vec<airlock::review::gates::Gate>| v.into_iter().map(|g| g.gate.id).collect::<Vec<_>>();
    assert_eq!(ids(s.list_gates(&q(Some(GateState::Expired))).await.unwrap()), ["gt_4"]);
    let expired = s.expire_gates(10).await.unwrap();
    assert_eq!(ids(expired.clone()), ["gt_4"]);
    assert_eq!(expired[0].decision.as_ref().unwrap().at, expired[0].deadline);
    assert!(s.expire_gates(10).await.unwrap().is_empty(), "written once");
    let late = decide("gt_4", Verdict::Approve, None, bob, bob_secret);
    assert!(matches!(s.decide_gate(&late).await.unwrap(), Decided::NotPending(_)));
    // Listings by state; newest first unless ascending; the cursor.
    assert_eq!(ids(s.list_gates(&q(None)).await.unwrap()), ["gt_4", "gt_2", "gt_1"]);
    assert_eq!(
        ids(s.list_gates(&GateQuery { ascending: true, ..q(None) }).await.unwrap()),
        ["gt_1", "gt_2", "gt_4"]
    );
    assert_eq!(ids(s.list_gates(&q(Some(GateState::Approved))).await.unwrap()), ["gt_1"]);
    assert_eq!(ids(s.list_gates(&q(Some(GateState::Abandoned))).await.unwrap()), ["gt_2"]);
    assert!(s.list_gates(&q(Some(GateState::Pending))).await.unwrap().is_empty());
    let page = s.list_gates(&GateQuery { after: Some(d2.n), ..q(None) }).await.unwrap();
    assert_eq!(ids(page), ["gt_1"]);
    let session = GateQuery { session: Some("GS2".into()), ..q(None) };
    assert_eq!(ids(s.list_gates(&session).await.unwrap()), ["gt_4"]);
    // A decided gate frees its place under the caps.
    let Opened::Gate(_) = open(new_gate("gt_6", "GS1", 60_000)).await else { panic!("g6") };

    // Every step is an event of the requester's history, source `gate`, once.
    let events = s
        .query_events(&EventQuery {
            user_id: Some(ana.id.clone()),
            source: Some(Source::Gate),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut kinds: Vec<(String, String)> =
        events.iter().map(|e| (e.id.clone(), e.kind.clone())).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("gt_1:approved", "gate.approved"),
            ("gt_1:requested", "gate.requested"),
            ("gt_2:abandoned", "gate.abandoned"),
            ("gt_2:requested", "gate.requested"),
            ("gt_4:expired", "gate.expired"),
            ("gt_4:requested", "gate.requested"),
            ("gt_6:requested", "gate.requested"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let approved = events.iter().find(|e| e.id == "gt_1:approved").unwrap();
    assert_eq!(approved.airlock_session.as_deref(), Some("GS1"));
    assert_eq!(approved.session, None);
    let p: serde_json::Value = serde_json::from_str(&approved.payload).unwrap();
    assert_eq!(
        (p["by_email"].as_str(), p["note"].as_str()),
        (Some("bob@example.test"), Some("looks right"))
    );
    assert_eq!(p["digest"], g1.gate.digest.as_str());
}

/// The console's reads agree on both stores: `/people`'s per-day counts, denied attempts,
/// latest receipt and open flags ([`Store::person_activity`]), the timeline chart's hours
/// ([`Store::hour_counts`]), flag marks ([`Store::event_flag_counts`]), and the timeline's
/// query shapes (`kinds`, `any_session`, newest first with a cursor).
async fn console_reads_conformance<S: Store>(admin: &S, s: &S) {
    const HOUR: Micros = 3_600_000_000;
    const DAY: Micros = 24 * HOUR;
    let cara = admin.add_user("cara@example.test", Role::Member).await.unwrap();
    let quiet = admin.add_user("quiet@example.test", Role::Member).await.unwrap();
    let week = T0 - T0.rem_euclid(DAY);
    let egress = |id: &str, ts: Micros, allowed: bool| NewEvent {
        kind: if allowed { "connect" } else { "denied" }.into(),
        ts,
        session: Some("CS".into()),
        payload: format!(r#"{{"id":"{id}","host":"h.test","allowed":{allowed},"repo":"r"}}"#),
        ..ev(Source::Egress, id, Some("CS"), None)
    };
    let line = |id: &str, ts: Micros| NewEvent {
        kind: "assistant".into(),
        ts,
        session: Some("agent-session".into()),
        airlock_session: Some("CS".into()),
        file: Some("p/a.jsonl".into()),
        offset: Some(0),
        payload: r#"{"type":"assistant"}"#.into(),
        ..ev(Source::Claude, id, None, None)
    };
    let batch = vec![
        egress("c1", week + HOUR, true),      // day 0, hour 1
        egress("c2", week + HOUR + 5, false), // day 0, hour 1
        line("c3", week + 2 * HOUR),          // day 0, hour 2
        egress("c4", week + 3 * DAY, false),  // day 3
        egress("c5", week + 8 * DAY, true),   // outside the week
        egress("c6", week - 1, true),         // before it
    ];
    let ins = s.insert_events(&cara.id, T0, &batch).await.unwrap();
    let flag = NewFlag {
        id: "console-conf-flag".into(),
        rule_id: "r".into(),
        title: "t".into(),
        severity: Severity::High,
        user_id: cara.id.clone(),
        session: Some("CS".into()),
        detail: "d".into(),
        event_pks: vec![ins[1].pk],
    };
    s.insert_flags(std::slice::from_ref(&flag)).await.unwrap();

    let ids = vec![quiet.id.clone(), cara.id.clone()];
    let act = s.person_activity(&ids, week).await.unwrap();
    assert_eq!(act.len(), 2);
    assert_eq!(
        (act[0].user_id.as_str(), act[0].daily, act[0].last_received),
        (quiet.id.as_str(), [(0, 0); 7], None)
    );
    assert!(act[0].open_flags.is_empty());
    let c = &act[1];
    assert_eq!(c.user_id, cara.id);
    assert_eq!(c.daily, [(3, 1), (0, 0), (0, 0), (1, 1), (0, 0), (0, 0), (0, 0)], "{c:?}");
    assert_eq!(c.last_received, ins.iter().map(|i| i.received_at).max());
    assert_eq!(c.open_flags, vec![("high".to_string(), 1)]);

    let hours = s.hour_counts(&cara.id, week, 24).await.unwrap();
    let h1 = hours.iter().find(|h| h.hour == 1).unwrap();
    assert_eq!((h1.allowed, h1.denied, h1.transcript, h1.flags), (1, 1, 0, 1), "{hours:?}");
    let h2 = hours.iter().find(|h| h.hour == 2).unwrap();
    assert_eq!((h2.allowed, h2.denied, h2.transcript, h2.flags), (0, 0, 1, 0));
    assert_eq!(hours.len(), 2, "hours without events are left out: {hours:?}");

    let marks = s.event_flag_counts(&[ins[0].pk, ins[1].pk]).await.unwrap();
    assert_eq!(marks, vec![(ins[1].pk, 1)]);
    assert!(s.event_flag_counts(&[]).await.unwrap().is_empty());

    // Newest first by ts, two at a time, the cursor reading strictly before the last row.
    let mut q = EventQuery {
        user_id: Some(cara.id.clone()),
        any_session: Some("CS".into()),
        order: EventOrder::Ts,
        descending: true,
        limit: 2,
        ..Default::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = s.query_event_page(&q).await.unwrap().events;
        let Some(last) = page.last() else { break };
        q.after = Some(last.pk);
        q.after_ts = Some(last.ts);
        seen.extend(page.iter().map(|e| e.id.clone()));
    }
    assert_eq!(
        seen,
        ["c5", "c4", "c3", "c2", "c1", "c6"],
        "the transcript line by its airlock_session"
    );
    let kinds = EventQuery {
        user_id: Some(cara.id.clone()),
        kinds: vec!["denied".into(), "assistant".into()],
        limit: 10,
        ..Default::default()
    };
    let got: Vec<String> =
        s.query_event_page(&kinds).await.unwrap().events.into_iter().map(|e| e.id).collect();
    assert_eq!(got, ["c2", "c3", "c4"]);

    // An action gate's step line (egress type `gate`, `allowed: false`) is an event, but not an
    // attempt: neither allowed nor denied.
    let step = NewEvent {
        kind: "gate".into(),
        ts: week + HOUR,
        session: Some("QS".into()),
        payload: r#"{"id":"g1","method":"GATE","host":"h.test","allowed":false,"gate":{"step":"requested"}}"#.into(),
        ..ev(Source::Egress, "g1", Some("QS"), None)
    };
    s.insert_events(&quiet.id, T0, &[step]).await.unwrap();
    let act = s.person_activity(std::slice::from_ref(&quiet.id), week).await.unwrap();
    assert_eq!(act[0].daily[0], (1, 0), "{act:?}");
    let hours = s.hour_counts(&quiet.id, week, 24).await.unwrap();
    let counts: Vec<_> = hours.iter().map(|h| (h.hour, h.allowed, h.denied)).collect();
    assert_eq!(counts, [(1, 0, 0)], "{hours:?}");
}

/// The transcript columns round-trip, and the comparison's reads agree on both stores: the
/// latest `transcript.file` per file in byte order (upper case before lower, ASCII before
/// UTF-8), truncated there, and line counts per (session, file) without conflicts.
async fn transcripts_conformance<S: Store>(admin: &S, s: &S, ana: &str, bob: &str) {
    let tf = |file: &str, bytes: u64| NewEvent {
        source: Source::Session,
        id: format!("TS:transcript:{file}"),
        kind: "transcript.file".into(),
        ts: 1,
        session: Some("TS".into()),
        seq: None,
        boot: None,
        payload: format!(r#"{{"airlock_session":"TS","file":"{file}","bytes":{bytes}}}"#),
        airlock_session: Some("TS".into()),
        file: Some(file.into()),
        offset: None,
    };
    let line = |id: &str, session: &str, file: &str, offset: i64, payload: &str| NewEvent {
        source: Source::Claude,
        id: id.into(),
        kind: "user".into(),
        ts: 1,
        session: Some("agent".into()),
        seq: None,
        boot: None,
        payload: payload.into(),
        airlock_session: Some(session.into()),
        file: Some(file.into()),
        offset: Some(offset),
    };
    let files = ["é.jsonl", "a.jsonl", "Z.jsonl", "B.jsonl"];
    let mut batch: Vec<NewEvent> = files.iter().map(|f| tf(f, 1)).collect();
    // A resend with another prefix: a conflict, the latest for its file.
    batch.push(tf("a.jsonl", 2));
    batch.push(line("l1", "TS", "a.jsonl", 0, r#"{"n":1}"#));
    batch.push(line("l2", "TS", "a.jsonl", 8, r#"{"n":2}"#));
    batch.push(line("l2", "TS", "a.jsonl", 8, r#"{"n":"changed"}"#));
    batch.push(line("l3", "other", "a.jsonl", 16, r#"{"n":3}"#));
    batch.push(line("l4", "TS", "é.jsonl", 0, r#"{"n":4}"#));
    let ins = s.insert_events(ana, 5, &batch).await.unwrap();
    assert!(ins[4].conflict.is_some() && ins[7].conflict.is_some(), "{ins:?}");
    let q = EventQuery {
        user_id: Some(ana.into()),
        source: Some(Source::Claude),
        limit: 100,
        ..Default::default()
    };
    let got = s.query_events(&q).await.unwrap();
    let l1 = got.iter().find(|e| e.id == "l1").unwrap();
    assert_eq!(
        (l1.airlock_session.as_deref(), l1.file.as_deref(), l1.offset),
        (Some("TS"), Some("a.jsonl"), Some(0))
    );

    let items = s.session_transcript_items(ana, "TS", 10).await.unwrap();
    assert_eq!(items.end_record, None);
    let order: Vec<&str> = items.published.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(order, ["B.jsonl", "Z.jsonl", "a.jsonl", "é.jsonl"]);
    assert!(items.published[2].payload.contains(r#""bytes":2"#), "{:?}", items.published[2]);
    let first_two = s.session_transcript_items(ana, "TS", 2).await.unwrap();
    let order: Vec<&str> = first_two.published.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(order, ["B.jsonl", "Z.jsonl"]);
    let want: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    let mut counts = s.transcript_line_counts(ana, "TS", &want).await.unwrap();
    counts.sort();
    assert_eq!(counts, vec![("a.jsonl".to_string(), 2), ("é.jsonl".to_string(), 1)]);
    // Another user's view of the same session id is empty; the end record is found by id.
    assert!(s.session_transcript_items(bob, "TS", 10).await.unwrap().published.is_empty());
    let end = NewEvent {
        source: Source::Session,
        id: "TS:end".into(),
        kind: "end".into(),
        ts: 2,
        session: Some("TS".into()),
        seq: None,
        boot: None,
        payload: r#"{"transcripts":[]}"#.into(),
        airlock_session: None,
        file: None,
        offset: None,
    };
    s.insert_events(ana, 6, &[end]).await.unwrap();
    let items = s.session_transcript_items(ana, "TS", 10).await.unwrap();
    assert_eq!(items.end_record.as_deref(), Some(r#"{"transcripts":[]}"#));
    assert!(admin.user_by_id(ana).await.unwrap().is_some());
    assert!(admin.user_by_id("no-such-user").await.unwrap().is_none());
}

#[test]
fn conformance_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    rt().block_on(conformance(&s, &s, true));
    // Insert-only: the triggers refuse UPDATE and DELETE on every table.
    for sql in [
        "UPDATE events SET payload = '{}'",
        "DELETE FROM events",
        "DELETE FROM event_keys",
        "UPDATE user_roles SET role = 'admin'",
        "DELETE FROM token_revocations",
        "UPDATE flag_states SET state = 'open'",
        "DELETE FROM flags",
        "DELETE FROM log_leaves",
        "UPDATE log_leaves SET leaf_hash = leaf_hash",
        "UPDATE log_tiers SET hash = hash",
        "DELETE FROM log_tiers",
        "DELETE FROM log_checkpoints",
        "UPDATE log_cosigners SET user_id = user_id",
        "DELETE FROM log_cosignatures",
    ] {
        let e = s.execute_raw(sql).unwrap_err().to_string();
        assert!(e.contains("insert-only"), "{sql}: {e}");
    }
    // An owner who lifts the trigger and deletes an event row leaves its leaf behind: an
    // orphan of that user, found; the tree itself is unchanged.
    let (ana, head) = rt().block_on(async {
        (s.user_by_email("ana@example.test").await.unwrap().unwrap(), s.log_head().await.unwrap())
    });
    s.execute_raw("DROP TRIGGER events_no_delete").unwrap();
    assert_eq!(s.execute_raw("DELETE FROM events WHERE id = 'log-1'").unwrap(), 1);
    let (orphans, after) =
        rt().block_on(async { (s.log_orphans(&ana.id, 10).await.unwrap(), s.log_head().await) });
    assert_eq!(orphans.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(), ["log-1"]);
    assert_eq!(after.unwrap(), head);
    // Reopening keeps the data (one file under the data dir).
    drop(s);
    assert!(dir.path().join("review.db").exists());
    let s = SqliteStore::open(dir.path()).unwrap();
    // ana and bob, and cara and quiet of the console reads.
    assert_eq!(rt().block_on(s.list_users()).unwrap().len(), 4);
}

#[test]
fn conformance_postgres_as_runtime_role() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let rt = rt();
    rt.block_on(async {
        let admin = PgStore::connect(&db.admin_url, 1).await.unwrap();
        let s = PgStore::connect(&db.runtime_url, 2).await.unwrap();
        conformance(&admin, &s, false).await;
    });
    // Insert-only, connected as the runtime role: no UPDATE, DELETE or TRUNCATE anywhere.
    for table in postgres::TABLES {
        for sql in [
            format!("UPDATE {table} SET {} = {}", col(table), col(table)),
            format!("DELETE FROM {table}"),
            format!("TRUNCATE {table}"),
        ] {
            let e = db.runtime_sql(&sql).unwrap_err();
            assert!(e.contains("permission denied") || e.contains("insert-only"), "{sql}: {e}");
        }
    }
    // An owner who bypasses the triggers and deletes an event row leaves its leaf behind: an
    // orphan of that user, found.
    db.owner_sql(
        "SET session_replication_role = replica; DELETE FROM events WHERE id = 'log-1'; \
         SET session_replication_role = origin;",
    )
    .unwrap();
    rt.block_on(async {
        let s = PgStore::connect(&db.runtime_url, 1).await.unwrap();
        let ana = s.user_by_email("ana@example.test").await.unwrap().unwrap();
        let orphans = s.log_orphans(&ana.id, 10).await.unwrap();
        assert_eq!(orphans.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(), ["log-1"]);
        let bob = s.user_by_email("bob@example.test").await.unwrap().unwrap();
        assert!(s.log_orphans(&bob.id, 10).await.unwrap().is_empty());
    });
    // Even the owner is stopped by the triggers.
    let e = db.owner_sql("UPDATE events SET payload = '{}'").unwrap_err();
    assert!(e.contains("insert-only"), "{e}");
    let e = db.owner_sql("DELETE FROM users").unwrap_err();
    assert!(e.contains("insert-only"), "{e}");
    let e = db.owner_sql("TRUNCATE events").unwrap_err();
    assert!(e.contains("insert-only"), "{e}");
    // The runtime role can read and insert.
    assert_eq!(db.runtime_sql("SELECT count(*) FROM users").unwrap(), "4");
    // Grants are exactly INSERT + SELECT on each table.
    let grants = db
        .owner_sql(&format!(
            "SELECT string_agg(DISTINCT privilege_type, ',' ORDER BY privilege_type) FROM information_schema.role_table_grants WHERE grantee = '{}'",
            db.role
        ))
        .unwrap();
    assert_eq!(grants, "INSERT,SELECT");
}

fn col(table: &str) -> &'static str {
    match table {
        "schema_migrations" => "version",
        "flag_events" => "flag_id",
        "events" | "event_keys" => "id",
        "token_revocations" | "user_roles" | "flag_states" | "user_passwords" => "n",
        "invites"
        | "invite_uses"
        | "console_sessions"
        | "console_session_seen"
        | "console_session_ends" => "hash",
        "auth_log" => "slot",
        "gate_decisions" => "gate_id",
        "log_leaves" | "log_tiers" => "idx",
        "log_checkpoints" | "log_cosignatures" => "n",
        "log_cosigners" => "key",
        _ => "id",
    }
}

#[test]
fn postgres_partitions_by_received_month() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let rt = rt();
    // A month far ahead has no partition yet: rows would land in DEFAULT. Create it, insert.
    let future = time::macros::datetime!(2031-07-15 12:00 UTC);
    rt.block_on(async {
        let owner = postgres::owner_client(&db.owner_url).await.unwrap();
        let report = postgres::maintain_at(&owner, future, 0).await.unwrap();
        assert_eq!(report.created, vec!["events_2031_07".to_string()]);
        assert_eq!(report.default_rows, 0);
        let admin = PgStore::connect(&db.admin_url, 1).await.unwrap();
        let u = admin.add_user("p@example.test", Role::Member).await.unwrap();
        // received_at is the database clock (a supplied one is refused), so rows for other
        // months are planted by the superuser with triggers off (session_replication_role).
        for (id, at) in [("p1", "2031-07-15T12:00:00Z"), ("p2", "2040-01-02T00:00:00Z")] {
            owner
                .batch_execute(&format!(
                    "SET session_replication_role = replica;
                     INSERT INTO events (pk, user_id, source, id, type, ts, received_at, payload)
                       VALUES (nextval('events_pk_seq'), '{}', 'egress', '{id}', 'connect', 0, '{at}', '{{}}');
                     SET session_replication_role = origin;",
                    u.id
                ))
                .await
                .unwrap();
        }
        // The runtime role's rows land in the current month.
        let s = PgStore::connect(&db.runtime_url, 1).await.unwrap();
        s.insert_events(&u.id, 0, &[ev(Source::Egress, "p3", None, None)]).await.unwrap();
    });
    assert_eq!(
        db.owner_sql("SELECT tableoid::regclass FROM events WHERE id = 'p1'").unwrap(),
        "events_2031_07"
    );
    assert_eq!(
        db.owner_sql("SELECT tableoid::regclass FROM events WHERE id = 'p2'").unwrap(),
        "events_default"
    );
    let run = world
        .airlockd(world.tmp.path())
        .args(["review", "maintain", "--database", &db.owner_url])
        .run()
        .expect_code(0);
    assert!(run.stderr().contains("events_default holds 1 rows"), "{}", run.stderr());
    // The current month's partition exists after migrate, and holds the runtime role's row.
    let now = time::OffsetDateTime::now_utc();
    let name = format!("events_{:04}_{:02}", now.year(), u8::from(now.month()));
    assert_eq!(db.owner_sql(&format!("SELECT to_regclass('{name}') IS NOT NULL")).unwrap(), "t");
    assert_eq!(
        db.owner_sql("SELECT tableoid::regclass FROM events WHERE id = 'p3'").unwrap(),
        name
    );
    // Every partition maintain made carries its TRUNCATE trigger.
    let e = db.owner_sql("TRUNCATE events_2031_07").unwrap_err();
    assert!(e.contains("insert-only"), "{e}");
}

async fn pg(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// The review log's sequencer on PostgreSQL: one instance at a time holds the advisory lock
/// (the other answers `None`), an event whose transaction commits after a later `pk`'s is
/// still sequenced, the lock goes with its session (a killed connection: another instance
/// takes over and the first, reconnected, is refused), and the tree stays one tree throughout.
#[test]
fn postgres_log_has_one_sequencer_and_sequences_late_commits() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    rt().block_on(async {
        let admin = PgStore::connect(&db.admin_url, 1).await.unwrap();
        let u = admin.add_user("seq@example.test", Role::Member).await.unwrap();
        let a = PgStore::connect(&db.runtime_url, 1).await.unwrap();
        let b = PgStore::connect(&db.runtime_url, 1).await.unwrap();
        let batch: Vec<NewEvent> =
            (0..5).map(|i| ev(Source::External, &format!("s-{i}"), None, None)).collect();
        let r = a.insert_events(&u.id, 0, &batch).await.unwrap();
        assert!(r.iter().all(|i| i.leaf_index.is_none()), "ingest never waits for the log");
        assert_eq!(a.log_sequence(100).await.unwrap().map(|h| h.appended), Some(5));
        for _ in 0..3 {
            assert_eq!(b.log_sequence(100).await.unwrap(), None, "A's session holds the lock");
        }
        assert_eq!(a.log_sequence(100).await.unwrap().map(|h| h.appended), Some(0));

        // Two transactions commit out of pk order: the later pk is sequenced first, the
        // earlier one once it commits.
        let (c1, c2) = (pg(&db.runtime_url).await, pg(&db.runtime_url).await);
        let insert = |id: &str| {
            format!(
                "INSERT INTO events (pk, user_id, source, id, type, ts, payload)
                 VALUES (nextval('events_pk_seq'), '{}', 'external', '{id}', 't', 0, '{{}}')",
                u.id
            )
        };
        c1.batch_execute(&format!("BEGIN; {}", insert("late"))).await.unwrap();
        c2.batch_execute(&format!("BEGIN; {}; COMMIT", insert("early"))).await.unwrap();
        assert_eq!(a.log_sequence(100).await.unwrap().map(|h| h.appended), Some(1));
        c1.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            a.log_sequence(100).await.unwrap().map(|h| h.appended),
            Some(1),
            "the earlier pk, committed later, is not skipped"
        );
        check_log(&a, false).await;
        let q = EventQuery { user_id: Some(u.id.clone()), limit: 100, ..Default::default() };
        let evs = a.query_events(&q).await.unwrap();
        let pk_of = |id: &str| evs.iter().find(|e| e.id == id).unwrap().pk;
        let (late, early) = (pk_of("late"), pk_of("early"));
        assert!(late < early);
        let l = a.log_leaves(&[late, early]).await.unwrap();
        assert!(l[0].index > l[1].index, "leaves in commit order: {l:?}");

        // A's sequencer connection dies while it waits for an open transaction's event: the
        // lock goes with its session, B takes over and its first pass (a sweep below the last
        // leaf) finds that event once committed, and A, reconnected, is refused.
        c1.batch_execute(&format!("BEGIN; {}", insert("late-2"))).await.unwrap();
        c2.batch_execute(&format!("BEGIN; {}; COMMIT", insert("early-2"))).await.unwrap();
        assert_eq!(a.log_sequence(100).await.unwrap().map(|h| h.appended), Some(1));
        let killed = db
            .owner_sql(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND objid = {}
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                postgres::LOG_SEQUENCER_LOCK
            ))
            .unwrap();
        assert_eq!(killed, "1");
        c1.batch_execute("COMMIT").await.unwrap();
        let mut took = None;
        for _ in 0..100 {
            if let Some(h) = b.log_sequence(100).await.unwrap() {
                took = Some(h);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(took.map(|h| h.appended), Some(1), "B took over and found late-2");
        let mut refused = false;
        for _ in 0..10 {
            match a.log_sequence(100).await {
                Ok(None) => {
                    refused = true;
                    break;
                }
                Ok(Some(h)) => panic!("two sequencers at once: {h:?}"),
                Err(_) => {} // the dead connection, noticed
            }
        }
        assert!(refused, "A reconnected and was refused");
        b.insert_events(&u.id, 0, &[ev(Source::External, "after", None, None)]).await.unwrap();
        let (head, _) = check_log(&b, false).await;
        assert_eq!(head.size, 10);

        // B's instance goes away: its lock with it.
        drop(b);
        let mut back = None;
        for _ in 0..100 {
            if let Some(h) = a.log_sequence(100).await.unwrap() {
                back = Some(h);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(back, Some(head), "A sequences again, the same tree");
    });
}
