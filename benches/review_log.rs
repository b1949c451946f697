//! The review log's costs (docs/evidence.md; results in docs/BENCHMARKS.md):
//!
//! 1. **Inclusion proofs at 10⁷ leaves** through the server's own path (`LogHub::inclusion`
//!    over an embedded store: tiles read with `log_tier`, full tiles cached), for random leaf
//!    indices: p50/p90/p99 latency, first (cold) proofs and later (warm) ones apart. Baseline
//!    in the same run: the same proofs from a tree held wholly in memory (`MemTree`). The
//!    store is filled directly (leaf rows and tier hashes written with one prepared statement
//!    per table in one transaction), since ingesting 10⁷ events over HTTP would take hours
//!    and measures ingest, not proofs.
//! 2. **`airlock verify` of a ~1 GiB export**: a synthetic export (events of ~900-byte
//!    payloads, their leaves in a `MemTree`, a signed checkpoint, every event with its proof,
//!    the `end` line) checked by `evidence::export::verify_export`, the function `airlock
//!    verify` runs. Baseline in the same run: reading the same file line by line and hashing
//!    each line with SHA-256 (the floor of any check that reads every byte).
//!
//! `cargo bench --bench review_log` (env: BENCH_LEAVES, default 10,000,000; BENCH_PROOFS,
//! 2,000; BENCH_EXPORT_MB, 1024). Loopback-free: no network at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::log::LogHub;
use airlock::review::store::Store;
use airlock::review::store::sqlite::SqliteStore;
use airlock::tlog::merkle::{Edge, Hash, MemTree, Prover, leaf_hash};
use airlock::tlog::note::NoteSigner;
use airlock::tlog::{EventLeaf, b64, sha256};
use std::io::{BufRead, BufWriter, Write};
use std::time::{Duration, Instant};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A deterministic xorshift, so runs pick the same indices.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn fmt(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn leaf_for(i: u64) -> Hash {
    leaf_hash(&i.to_be_bytes())
}

fn proofs(n: u64, count: u64) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let made = rt
        .block_on(SqliteStore::create(dir.path(), |s| async move {
            s.add_user("bench@example.test", airlock::review::Role::Admin).await?;
            Ok(())
        }))
        .unwrap();
    drop(made);
    let t0 = Instant::now();
    {
        let mut db = rusqlite::Connection::open(dir.path().join("review.db")).unwrap();
        db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;").unwrap();
        let tx = db.transaction().unwrap();
        {
            let mut leaf_row = tx
                .prepare(
                    "INSERT INTO log_leaves (idx, event_pk, user_id, source, id, received_at, \
                     payload_sha256, leaf_hash) VALUES (?1, ?1, 'u', 'external', ?2, 0, ?3, ?4)",
                )
                .unwrap();
            let mut tier_row =
                tx.prepare("INSERT INTO log_tiers (level, idx, hash) VALUES (?1, ?2, ?3)").unwrap();
            let mut edge = Edge::new();
            let zero = [0u8; 32];
            for i in 0..n {
                let h = leaf_for(i);
                leaf_row
                    .execute(rusqlite::params![i as i64, i.to_string(), &zero[..], &h[..]])
                    .unwrap();
                for t in edge.append(h) {
                    tier_row
                        .execute(rusqlite::params![t.level, t.index as i64, &t.hash[..]])
                        .unwrap();
                }
            }
        }
        tx.commit().unwrap();
    }
    eprintln!("filled an embedded store with {n} leaves in {:.1} s", t0.elapsed().as_secs_f64());
    let store = SqliteStore::open_existing(dir.path()).unwrap();
    let hub = LogHub::new(None);
    let head = rt.block_on(store.log_head()).unwrap();
    assert_eq!(head.size, n);

    // The in-memory baseline holds every tier (n hashes of tier 0: 320 MB at 10⁷).
    let mut mem = MemTree::new();
    (0..n).for_each(|i| mem.push(leaf_for(i)));
    assert_eq!(mem.root(), head.root, "the store's root is the tree's");

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let idx: Vec<u64> = (0..count).map(|_| rng.next() % n).collect();
    let mut store_t = Vec::new();
    let mut mem_t = Vec::new();
    for &i in &idx {
        let t = Instant::now();
        let p = rt.block_on(hub.inclusion(&store, i, n)).unwrap().unwrap();
        store_t.push(t.elapsed());
        let t = Instant::now();
        let q = Prover::new(&mem).inclusion(i, n).unwrap().unwrap();
        mem_t.push(t.elapsed());
        assert_eq!(p, q);
    }
    let cold: Vec<Duration> = store_t[..store_t.len() / 10].to_vec();
    let mut all = store_t.clone();
    all.sort();
    let mut warm: Vec<Duration> = store_t[store_t.len() / 2..].to_vec();
    warm.sort();
    let mut cold = cold;
    cold.sort();
    mem_t.sort();
    println!("inclusion proofs at {n} leaves, {count} random indices:");
    println!(
        "  server path (embedded store + tile cache): p50 {}  p90 {}  p99 {}",
        fmt(pct(&all, 0.5)),
        fmt(pct(&all, 0.9)),
        fmt(pct(&all, 0.99))
    );
    println!(
        "    first 10% (cold cache) p50 {}; last 50% (warm) p50 {}",
        fmt(pct(&cold, 0.5)),
        fmt(pct(&warm, 0.5))
    );
    println!(
        "  in-memory tree (baseline): p50 {}  p90 {}",
        fmt(pct(&mem_t, 0.5)),
        fmt(pct(&mem_t, 0.9))
    );
    println!(
        "  ratio store/in-memory at p50: {:.1}x; target p50 <= 1 ms: {}",
        pct(&all, 0.5).as_secs_f64() / pct(&mem_t, 0.5).as_secs_f64(),
        if pct(&all, 0.5) <= Duration::from_millis(1) { "met" } else { "NOT met" }
    );
}

fn export_verify(megabytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("export.jsonl");
    let signer = NoteSigner::generate("airlock-review/bench").unwrap();
    let user = "u-bench";
    // ~900-byte payloads, like a busy egress line.
    let pad = "x".repeat(760);
    let payload = |i: u64| format!(r#"{{"i":{i},"host":"api.example.test","pad":"{pad}"}}"#);
    let received = |i: u64| 1_765_000_000_000_000i64 + (i as i64) * 1000;
    let line = |i: u64, hashes: &str| {
        let at = airlock::review::format_micros(received(i));
        format!(
            r#"{{"pk":{pk},"user_id":"{user}","source":"external","id":"e{i}","type":"x","ts":"{at}","session":null,"seq":null,"boot":null,"received_at":"{at}","payload":{p},"conflict_of":null,"airlock_session":null,"file":null,"offset":null,"leaf":{{"index":{i},"hashes":{hashes}}}}}"#,
            pk = i + 1,
            p = payload(i),
        )
    };
    // Events for ~`megabytes` MiB: a line's size with its proof (44-character hashes) at the
    // middle of the tree, estimated twice.
    let target = megabytes * 1024 * 1024;
    let mut n = target / 2000;
    for _ in 0..2 {
        let mid = n / 2;
        let len = airlock::tlog::merkle::inclusion_len(mid, n);
        let fake = serde_json::to_string(&vec![b64(&[0u8; 32]); len]).unwrap();
        n = (target / (line(mid, &fake).len() as u64 + 1)).max(1);
    }
    let t0 = Instant::now();
    let mut tree = MemTree::new();
    for i in 0..n {
        let p = payload(i);
        let id = format!("e{i}");
        tree.push(
            EventLeaf {
                user_id: user,
                source: "external",
                id: &id,
                received_at: received(i),
                payload_sha256: sha256(p.as_bytes()),
            }
            .hash(),
        );
    }
    let cp = airlock::tlog::note::Checkpoint {
        origin: signer.name().to_string(),
        size: n,
        root: tree.root(),
        extensions: vec!["time 1765000000".into()],
    };
    let note = signer.sign_note(&cp.body()).unwrap();
    {
        let mut w = BufWriter::new(std::fs::File::create(&path).unwrap());
        let header = serde_json::json!({"export": {
            "query": {"user": user, "source": null, "session": null, "flagged": null,
                      "since": null, "until": null, "ts_since": null, "ts_until": null,
                      "order": "received_at", "cursor": null, "view": false},
            "exported_at": "2026-12-06T00:00:00.000Z", "by": user, "format": 1,
            "log": {"key": signer.verifier().to_string(), "checkpoint": note, "tree_size": n,
                    "consistency": [], "orphans_checked": true}}});
        writeln!(w, "{header}").unwrap();
        let prover = Prover::new(&tree);
        for i in 0..n {
            let hashes: Vec<String> =
                prover.inclusion(i, n).unwrap().unwrap().iter().map(|h| b64(h)).collect();
            writeln!(w, "{}", line(i, &serde_json::to_string(&hashes).unwrap())).unwrap();
        }
        writeln!(w, r#"{{"end":{{"events":{n},"missing":0}}}}"#).unwrap();
    }
    let bytes = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "wrote a {:.0} MB export of {n} events in {:.1} s",
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    let mb = bytes as f64 / 1e6;
    // Baseline: read every line and hash it (the page cache is warm from the write).
    let t = Instant::now();
    let mut r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&path).unwrap());
    let mut line = Vec::new();
    let mut acc = 0u8;
    while r.read_until(b'\n', &mut line).unwrap() > 0 {
        acc ^= sha256(&line)[0];
        line.clear();
    }
    let floor = t.elapsed();
    std::hint::black_box(acc);
    let t = Instant::now();
    let r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&path).unwrap());
    let report = airlock::evidence::export::verify_export(r, &signer.verifier(), None).unwrap();
    let took = t.elapsed();
    assert!(report.ok(), "the synthetic export verifies");
    println!("airlock verify of a {mb:.0} MB export ({n} events):");
    println!(
        "  verify_export: {:.1} s, {:.0} MB/s (target >= 100 MB/s: {})",
        took.as_secs_f64(),
        mb / took.as_secs_f64(),
        if mb / took.as_secs_f64() >= 100.0 { "met" } else { "NOT met" }
    );
    println!(
        "  read + SHA-256 per line (floor): {:.1} s, {:.0} MB/s; verify / floor = {:.2}x the time",
        floor.as_secs_f64(),
        mb / floor.as_secs_f64(),
        took.as_secs_f64() / floor.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with nothing: keep that
    // quick.
    let bench = std::env::args().any(|a| a == "--bench");
    let leaves = if bench { env("BENCH_LEAVES", 10_000_000) } else { 5_000 };
    let count = if bench { env("BENCH_PROOFS", 2_000) } else { 50 };
    let mb = if bench { env("BENCH_EXPORT_MB", 1024) } else { 2 };
    let which = std::env::var("BENCH_ONLY").unwrap_or_default();
    if which.is_empty() || which == "proofs" {
        proofs(leaves, count);
    }
    if which.is_empty() || which == "verify" {
        export_verify(mb);
    }
}
