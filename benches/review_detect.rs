//! Detection quality and throughput. First it prints precision and recall per built-in rule
//! over the labelled corpus (`tests/fixtures/detect/cases.jsonl`) as a Markdown table; then
//! it measures throughput over transcript text with every built-in rule (aho-corasick
//! prefilter + regex confirmation, on the text and on each normalized/decoded rewrite of it),
//! per core (single-threaded). Baseline in the same run: a byte-sum pass over the same text
//! (memory bandwidth reference), the prefilter alone, and `Engine::scan_every_pass` (the
//! same rules with no rewrite skipped: the reference `scan` is proven equal to).
//!
//! `cargo bench --bench review_detect`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::Source;
use airlock::review::detect::{Engine, score_corpus};
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
        "curl -s 'https://api.example.test/v1/items?page=2&q=caf%C3%A9' | jq '.items[] | .id'\ncd src && cargo build --release 2>&1 | tail -n 20\n",
        "ETag: \"33a64df551425fcc55e4d42a148795d9f25f89d4\"\nauthorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl\n",
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

const CASES: &str = include_str!("../tests/fixtures/detect/cases.jsonl");

/// Precision and recall per rule on the labelled corpus, as a Markdown table.
fn print_quality(engine: &Engine) {
    let score = score_corpus(engine, CASES).unwrap();
    println!("\nDetection quality on {} labelled cases:\n", score.cases);
    println!("| Rule | Positives (found/all) | Negatives (clean/all) | Precision | Recall |");
    println!("|---|---|---|---|---|");
    let (mut tp, mut fp, mut fneg) = (0, 0, 0);
    for r in &score.rules {
        println!(
            "| `{}` | {}/{} | {}/{} | {:.3} | {:.3} |",
            r.rule,
            r.true_pos,
            r.true_pos + r.false_neg,
            r.true_neg,
            r.true_neg + r.false_pos,
            r.precision(),
            r.recall()
        );
        tp += r.true_pos;
        fp += r.false_pos;
        fneg += r.false_neg;
    }
    let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    println!(
        "| **all** | {tp}/{} | | **{:.3}** | **{:.3}** |\n",
        tp + fneg,
        ratio(tp, tp + fp),
        ratio(tp, tp + fneg)
    );
    for w in &score.wrong {
        println!("wrong: {w}");
    }
}

fn bench(c: &mut Criterion) {
    let engine = Engine::builtin().unwrap();
    print_quality(&engine);
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
    // The same rules without the selection (every rewrite searched with one prefilter over
    // all keywords): what `scan`'s selection buys, in the same run.
    g.bench_function("all_builtin_rules_every_pass", |b| {
        b.iter(|| {
            let mut hits = 0;
            for v in &views {
                hits += engine.scan_every_pass(Source::Claude, v, &payload).len();
            }
            black_box(hits)
        })
    });
    g.finish();
    // Shell commands (the `command` field also gets the parsed simple commands).
    let commands = [
        "cd /home/ana/src/payments && cargo test --lib -- retry 2>&1 | tail -n 40",
        "git status --short && git diff --stat HEAD~1",
        "rg -n 'fn retry' src/ | head -20",
        "F=target/debug; ls -la \"$F\" > /tmp/listing.txt",
        "python3 -m pytest tests/test_api.py -q -k 'not slow'",
        "curl -s https://api.example.test/v1/health | jq .status",
    ];
    let mut cmd_views = Vec::new();
    let mut cmd_bytes = 0;
    while cmd_bytes < 1024 * 1024 {
        let c = commands[cmd_views.len() % commands.len()];
        cmd_bytes += c.len();
        cmd_views.push(View {
            kind: "assistant".into(),
            command: vec![c.to_string()],
            ..View::default()
        });
    }
    let mut g = c.benchmark_group("review_detect_commands");
    g.throughput(Throughput::Bytes(cmd_bytes as u64));
    g.sample_size(20);
    g.bench_function("all_builtin_rules", |b| {
        b.iter(|| {
            let mut hits = 0;
            for v in &cmd_views {
                hits += engine.scan(Source::Claude, v, &payload).len();
            }
            black_box(hits)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
