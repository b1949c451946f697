//! The correlate fixture corpus replayed (issue 20): every fixture
//! (`tests/fixtures/correlate/<scenario>.jsonl`, one real `airlock run` session as the export
//! returned it) posted to a fresh loopback `airlockd review` as its own user, scored with
//! `rules/correlate.toml`; each labelled rule must fire and each `absent` one must not, and a
//! miss names its scenario. Needs no test hook: only `airlockd review` runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::correlate_score::{
    Labelled, fixtures_dir, load_fixture, load_labels, replay, score, table,
};

const RULES: [&str; 5] = [
    "correlate.retry-after-deny",
    "correlate.secret-then-egress",
    "correlate.unreported-egress",
    "correlate.claimed-vs-seen",
    "correlate.transcript-gap",
];

/// The corpus is what the scoring needs: ≥ 4 positives and ≥ 4 negatives per rule, and each
/// fixture a whole session (start and end records, its egress, its transcript, and the
/// `transcript.file` items that tie the two).
#[test]
fn the_fixture_corpus_has_enough_labelled_whole_sessions() {
    let dir = fixtures_dir();
    let labels = load_labels(&dir);
    for rule in RULES {
        let pos = labels.iter().filter(|l| l.expect.iter().any(|r| r == rule)).count();
        let neg = labels.iter().filter(|l| l.absent.iter().any(|r| r == rule)).count();
        assert!(pos >= 4 && neg >= 4, "{rule}: {pos} positives, {neg} negatives");
    }
    let mut names = BTreeSet::new();
    for l in &labels {
        assert!(names.insert(&l.name), "{} twice", l.name);
        for r in l.expect.iter().chain(&l.absent) {
            assert!(RULES.contains(&r.as_str()), "{}: unknown rule {r}", l.name);
        }
        let events = load_fixture(&dir, &l.name);
        let has = |source: &str, ty: &str| {
            events.iter().any(|e| e["source"] == source && (ty.is_empty() || e["type"] == ty))
        };
        for (source, ty) in [
            ("session", "start"),
            ("session", "end"),
            ("session", "transcript.file"),
            ("claude", ""),
        ] {
            assert!(has(source, ty), "{}: no {source} {ty} event", l.name);
        }
        let end = events.iter().find(|e| e["type"] == "end").unwrap();
        assert_eq!(end["session"], l.session.as_str(), "{}: labels name another session", l.name);
        // Every event belongs to the session: its own records and egress, and transcript
        // lines linked to it by publish.
        for e in &events {
            match e["source"].as_str().unwrap() {
                "egress" | "session" => assert_eq!(e["session"], l.session.as_str(), "{e}"),
                "claude" => assert_eq!(e["airlock_session"], l.session.as_str(), "{e}"),
                other => panic!("{}: unexpected source {other}", l.name),
            }
            for k in ["pk", "user_id", "received_at", "leaf"] {
                assert!(e.get(k).is_none(), "{}: server-specific {k} kept: {e}", l.name);
            }
        }
    }
}

fn lab(name: &str, expect: &[&str], absent: &[&str]) -> Labelled {
    Labelled {
        name: name.into(),
        what: String::new(),
        session: name.into(),
        expect: expect.iter().map(|s| (*s).to_owned()).collect(),
        absent: absent.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// The scoring itself, on a hand-made outcome: counts, precision, recall, the overall row, and
/// unlabelled rules left out.
#[test]
fn scoring_counts_only_labelled_rules() {
    let (a, b) = ("correlate.retry-after-deny", "correlate.transcript-gap");
    let labels = vec![
        lab("p1", &[a], &[b]),
        lab("p2", &[a], &[b]),
        lab("n1", &[], &[a, b]),
        lab("n2", &[], &[a]), // b unlabelled here: its firing counts nowhere
    ];
    let fired: BTreeMap<String, BTreeSet<String>> =
        [("p1", vec![a]), ("p2", vec![]), ("n1", vec![a]), ("n2", vec![b])]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
            .collect();
    let rows = score(&[a, b], &labels, &fired);
    assert_eq!((rows[0].tp, rows[0].fn_, rows[0].fp, rows[0].tn), (1, 1, 1, 1));
    assert_eq!(rows[0].precision(), Some(0.5));
    assert_eq!(rows[0].recall(), Some(0.5));
    assert_eq!((rows[1].tp, rows[1].fn_, rows[1].fp, rows[1].tn), (0, 0, 0, 3));
    assert_eq!((rows[1].precision(), rows[1].recall()), (None, None));
    assert_eq!(rows[2].rule, "all");
    assert_eq!((rows[2].tp, rows[2].fn_, rows[2].fp, rows[2].tn), (1, 1, 1, 4));
    let t = table(&rows);
    assert!(t.contains("| `correlate.retry-after-deny` | 1/2 | 1/2 | 0.500 | 0.500 |"), "{t}");
    assert!(t.contains("| **all** | 1/2 | 4/5 |"), "{t}");
}

/// Every labelled scenario judged right by the correlate pack, as the server raises flags.
#[test]
fn every_fixture_raises_exactly_its_labelled_correlate_flags() {
    let dir = fixtures_dir();
    let labels = load_labels(&dir);
    let rules_dir = dir.join("rules");
    let rules_arg = rules_dir.display().to_string();
    let out = replay(&crate::support::bin("airlockd"), &dir, &labels, &["--rules-dir", &rules_arg]);
    let mut wrong = Vec::new();
    for l in &labels {
        let got = &out.fired[&l.name];
        for r in &l.expect {
            if !got.contains(r) {
                wrong.push(format!("{}: {r} did not fire ({})", l.name, l.what));
            }
        }
        for r in &l.absent {
            if got.contains(r) {
                wrong.push(format!("{}: {r} fired and must not ({})", l.name, l.what));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong judgement(s):\n{}\n\n{}\nflags: {:#?}\nserver log:\n{}",
        wrong.len(),
        wrong.join("\n"),
        table(&score(&RULES, &labels, &out.fired)),
        out.flags,
        out.log
    );
    assert!(out.complete);
}

/// `enabled = false` switches a rule off and leaves the others: with only
/// `correlate.transcript-gap` on, the corpus raises that rule's labelled flags (waited for,
/// so the other sessions' checks have run) and no other correlate flag at all.
#[test]
fn disabled_correlate_rules_raise_nothing_while_an_enabled_one_still_does() {
    let dir = fixtures_dir();
    let labels = load_labels(&dir);
    let rules = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for rule in RULES {
        let enabled = rule == "correlate.transcript-gap";
        text.push_str(&format!("[[correlate]]\nid = \"{rule}\"\nenabled = {enabled}\n\n"));
    }
    std::fs::write(rules.path().join("correlate.toml"), text).unwrap();
    // Only the gap positives are expected now; everything else must stay silent.
    let only_gap: Vec<Labelled> = labels
        .iter()
        .map(|l| Labelled {
            expect: l.expect.iter().filter(|r| *r == "correlate.transcript-gap").cloned().collect(),
            ..l.clone()
        })
        .collect();
    assert!(only_gap.iter().any(|l| !l.expect.is_empty()));
    let arg = rules.path().display().to_string();
    let out = replay(&crate::support::bin("airlockd"), &dir, &only_gap, &["--rules-dir", &arg]);
    assert!(out.complete, "the gap flags did not all come: {:#?}\n{}", out.flags, out.log);
    for f in &out.flags {
        assert_eq!(f["rule_id"], "correlate.transcript-gap", "a disabled rule fired: {f}");
    }
}
