//! Correlate quality (issue 20): replays the fixture corpus (`tests/fixtures/correlate/`, 50
//! real `airlock run` sessions of the stand-in agent, each as the review server exported it)
//! into a fresh loopback `airlockd review` with `tests/fixtures/correlate/rules/`, and prints
//! precision and recall per correlate rule and overall against `labels.toml`, as a Markdown
//! table (target ≥ 0.9 each). The same replay and scoring as the integration test
//! `correlate_replay` (shared module `tests/it/correlate_score.rs`); no timing is measured
//! here (the correlate pack's ingest overhead is the `review_ingest` bench's).
//!
//! `cargo bench --bench correlate_quality`
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/it/correlate_score.rs"]
mod correlate_score;

use std::path::Path;

use correlate_score::{fixtures_dir, load_labels, replay, score, table};

const RULES: [&str; 5] = [
    "correlate.retry-after-deny",
    "correlate.secret-then-egress",
    "correlate.unreported-egress",
    "correlate.claimed-vs-seen",
    "correlate.transcript-gap",
];

fn main() {
    // `cargo bench` passes `--bench` (and any filter); there is nothing to select here.
    let dir = fixtures_dir();
    let labels = load_labels(&dir);
    let rules = dir.join("rules").display().to_string();
    let airlockd = Path::new(env!("CARGO_BIN_EXE_airlockd"));
    let out = replay(airlockd, &dir, &labels, &["--rules-dir", &rules]);
    println!("\nCorrelate quality on {} labelled sessions:\n", labels.len());
    print!("{}", table(&score(&RULES, &labels, &out.fired)));
    if !out.complete {
        println!(
            "\nNote: not every labelled positive was listed within {} s; the table counts \
             what was.",
            correlate_score::WAIT.as_secs()
        );
    }
}
