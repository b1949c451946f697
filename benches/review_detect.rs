//! Detection throughput over transcript text with every built-in rule (aho-corasick
//! prefilter + regex confirmation), per core (single-threaded). Baseline in the same run:
//! a byte-sum pass over the same text (memory bandwidth reference) and the prefilter alone.
//!
//! `cargo bench --bench review_detect`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::Source;
use airlock::review::detect::Engine;
use airlock::review::transcript::View;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

/// ~4 MB of realistic transcript text: code, prose, shell output, with a secret-looking
/// token and keyword near-misses sprinkled in.
fn corpus() -> Vec<String> {
    let chunks = [
        "     1→use std::time::Duration;\n     2→fn retry(budget: u32) -> Result<(), Error> {\n     3→    for attempt in 0..budget {\n     4→        match client.send(&request) {\n     5→            Ok(resp) => return Ok(resp),\n     6→            Err(e) if e.is_timeout() => sleep(Duration::from_millis(50 << attempt)),\n     7→            Err(e) => return Err(e.into()),\n     8→        }\n     9→    }\n",
        "I'll read the test first, then run cargo test to see whether the flake reproduces. The retry loop uses wall-clock sleeps, which makes the test timing-dependent; a mock clock would remove that.",
        "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 120 filtered out; finished in 0.42s\nCompiling payments v0.1.0 (/home/ana/src/payments)\n warning: unused variable: `task`\n",
        "diff --git a/src/lib.rs b/src/lib.rs\n@@ -12,7 +12,7 @@ impl Client {\n-    let timeout = Duration::from_secs(30);\n+    let timeout = self.config.timeout;\n",
        "The disk-usage task reported 41% used; risk of form submissions failing is low. Ask the user before any push.",
        "STRIPE_KEY=sk_test_not_a_real_key_0000 # placeholder from the fixture file\n",
    ];
    let mut out = Vec::new();
    let mut total = 0;
    let mut i = 0;
    while total < 4 * 1024 * 1024 {
        let c = chunks[i % chunks.len()];
        // Each text field is a few KB, like a tool result.
        let s: String = std::iter::repeat_n(c, 8).collect();
        total += s.len();
        out.push(s);
        i += 1;
    }
    out
}

fn bench(c: &mut Criterion) {
    let engine = Engine::builtin().unwrap();
    let texts = corpus();
    let bytes: usize = texts.iter().map(String::len).sum();
    let views: Vec<View> = texts
        .iter()
        .map(|t| View { kind: "user".into(), text: vec![t.clone()], ..View::default() })
        .collect();
    let payload = serde_json::json!({});
    let mut g = c.benchmark_group("review_detect");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.sample_size(20);
    g.bench_function("baseline_byte_sum", |b| {
        b.iter(|| {
            let mut s = 0u64;
            for t in &texts {
                s = s.wrapping_add(t.bytes().map(u64::from).sum::<u64>());
            }
            black_box(s)
        })
    });
    let ac = aho_corasick::AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .kind(Some(aho_corasick::AhoCorasickKind::DFA))
        .build(["AKIA", "ghp_", "sk_live_", "PRIVATE KEY-----", "xoxb-"])
        .unwrap();
    g.bench_function("baseline_prefilter_5_keywords", |b| {
        b.iter(|| texts.iter().map(|t| ac.find_overlapping_iter(t.as_str()).count()).sum::<usize>())
    });
    g.bench_function("all_builtin_rules", |b| {
        b.iter(|| {
            let mut hits = 0;
            for v in &views {
                hits += engine.scan(Source::Claude, v, &payload).len();
            }
            black_box(hits)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
