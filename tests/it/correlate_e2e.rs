//! Correlate flags end to end (issue 20): a real `airlock run` session of the stand-in agent
//! (tests/it/correlate_lab.rs) → `airlock publish` → the flag on the review server, linking
//! the events of both sides (the egress audit line and the transcript line, or the session
//! record); and a clean session raising no correlate flag.
//!
//! A clean session cannot be waited for (no flag will come), so it runs first and a positive
//! session after it: once the later session's flag is listed, the earlier end record's check
//! has run (end records are checked as they are ingested, in order).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::correlate_lab::{CLAIMED, GAP, Lab, Live, RETRY, SECRET, UNREPORTED, scenarios};
use crate::review_support::all_events;
use crate::support::wait_until;

/// Runs the named scenarios in order, publishing after each.
fn run(lab: &Lab, names: &[&str]) -> Vec<Live> {
    let all = scenarios(lab.port);
    names
        .iter()
        .map(|n| {
            let sc = all.iter().find(|s| s.name == *n).unwrap();
            let live = lab.session(sc);
            lab.publish();
            live
        })
        .collect()
}

/// The correlate flag `rule` on `session`, waited for (the check runs at ingest of the end
/// record; a minute covers a loaded machine).
fn flag(lab: &Lab, session: &str, rule: &str) -> Value {
    let mut found = None;
    wait_until(Duration::from_secs(60), || {
        found = lab.flags().into_iter().find(|f| f["rule_id"] == rule && f["session"] == session);
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!("no {rule} flag on session {session}: {:#?}\n{}", lab.flags(), lab.server.log())
    })
}

/// The events a flag links, by their `pk`.
fn linked(lab: &Lab, flag: &Value) -> Vec<Value> {
    let by_pk: BTreeMap<u64, Value> = all_events(&lab.server.base, &lab.token, "")
        .into_iter()
        .map(|e| (e["pk"].as_u64().unwrap(), e))
        .collect();
    let pks = flag["events"].as_array().unwrap();
    assert!(!pks.is_empty(), "{flag}");
    pks.iter().map(|p| by_pk[&p.as_u64().unwrap()].clone()).collect()
}

fn correlate_flags_on(lab: &Lab, session: &str) -> Vec<Value> {
    lab.flags()
        .into_iter()
        .filter(|f| {
            f["session"] == session && f["rule_id"].as_str().unwrap().starts_with("correlate.")
        })
        .collect()
}

/// A denial then the same path from another host of the registrable domain: the flag links
/// the refused audit line, the allowed retry and the tool calls that made them; the clean
/// session before it raises no correlate flag.
#[test]
fn retry_after_deny_live_links_the_denial_and_the_retrying_tool_call() {
    let Some(lab) = Lab::new(&[]) else { return };
    let lives = run(&lab, &["gap-none-intact", "retry-subdomain"]);
    let f = flag(&lab, &lives[1].session, RETRY);
    assert!(!f["detail"].as_str().unwrap_or("").is_empty(), "{f}");
    let ev = linked(&lab, &f);
    assert!(
        ev.iter().any(|e| e["source"] == "egress"
            && e["payload"]["host"] == "denied.test"
            && e["payload"]["allowed"] == false),
        "the denial is linked: {ev:#?}"
    );
    assert!(
        ev.iter().any(|e| e["source"] == "egress" && e["payload"]["host"] == "cdn.denied.test"),
        "the retry is linked: {ev:#?}"
    );
    assert!(
        ev.iter().any(|e| e["source"] == "claude"
            && e["airlock_session"] == lives[1].session.as_str()
            && e.to_string().contains("cdn.denied.test")),
        "the transcript's retrying tool call is linked: {ev:#?}"
    );
    assert_eq!(correlate_flags_on(&lab, &lives[0].session), Vec::<Value>::new());
}

/// A credential file read, then a 4 KiB upload: the flag links the read (transcript) and the
/// upload (egress, `bytes_sent` above `min_bytes`).
#[test]
fn secret_then_egress_live_links_the_credential_read_and_the_upload() {
    let Some(lab) = Lab::new(&[]) else { return };
    let lives = run(&lab, &["secret-aws-cat-post"]);
    let f = flag(&lab, &lives[0].session, SECRET);
    let ev = linked(&lab, &f);
    assert!(
        ev.iter().any(|e| e["source"] == "egress"
            && e["payload"]["host"] == "upload.test"
            && e["payload"]["bytes_sent"].as_u64() == Some(4096)),
        "the upload is linked: {ev:#?}"
    );
    assert!(
        ev.iter().any(|e| e["source"] == "claude" && e.to_string().contains(".aws/credentials")),
        "the credential read is linked: {ev:#?}"
    );
}

/// "I did not access the network" after a fetch: the flag links the final message and the
/// egress line; the same claim in a session without egress (run first) raises nothing.
#[test]
fn claimed_vs_seen_live_links_the_final_message_and_the_egress() {
    let Some(lab) = Lab::new(&[]) else { return };
    let lives = run(&lab, &["claimed-none-true-no-network", "claimed-no-network-after-curl"]);
    let f = flag(&lab, &lives[1].session, CLAIMED);
    let ev = linked(&lab, &f);
    assert!(
        ev.iter().any(|e| e["source"] == "egress" && e["payload"]["host"] == "allowed.test"),
        "the egress is linked: {ev:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e["source"] == "claude"
                && e.to_string().contains("I did not access the network")),
        "the final message is linked: {ev:#?}"
    );
    assert_eq!(correlate_flags_on(&lab, &lives[0].session), Vec::<Value>::new());
}

/// A transcript altered on the host after the session: the flag links the session's record
/// side (the end record or the `transcript.file` item whose hash differs).
#[test]
fn transcript_altered_after_the_session_live_is_a_gap_linking_the_session_record() {
    let Some(lab) = Lab::new(&[]) else { return };
    let lives = run(&lab, &["gap-altered-after-session"]);
    let f = flag(&lab, &lives[0].session, GAP);
    let ev = linked(&lab, &f);
    assert!(
        ev.iter().any(|e| e["source"] == "session"
            && (e["type"] == "end" || e["type"] == "transcript.file")
            && e["session"] == lives[0].session.as_str()),
        "the session record side is linked: {ev:#?}"
    );
}

/// A background process left running after its tool call: the flag links the egress line and
/// the transcript lines around the quiet span it fell in.
#[test]
fn unreported_egress_live_links_the_background_attempt_and_the_quiet_span() {
    let Some(lab) = Lab::new(&[]) else { return };
    let lives = run(&lab, &["unreported-background-curl"]);
    let f = flag(&lab, &lives[0].session, UNREPORTED);
    let ev = linked(&lab, &f);
    assert!(
        ev.iter().any(|e| e["source"] == "egress"
            && e["payload"]["host"] == "allowed.test"
            && e["payload"]["url"].as_str().is_some_and(|u| u.ends_with("/beacon"))),
        "the background attempt is linked: {ev:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e["source"] == "claude" && e["airlock_session"] == lives[0].session.as_str()),
        "a transcript line of the session is linked: {ev:#?}"
    );
}
