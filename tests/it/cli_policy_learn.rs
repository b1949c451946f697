//! `airlock policy learn` through the real binary: audit lines planted in the repo's log
//! directory (and, with test hooks, written by a real sandboxed session) become minimal
//! `allow` entries — grouped by registrable domain, ports only where needed, private and
//! blocked/managed refusals not proposed, allowed targets not re-proposed — printed as a diff,
//! written only with `--yes`, and never trusted.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use airlock::audit::{rfc3339_ms, utc_date};

use crate::support::{Run, World};

const TRUSTED: &str = "# team policy: keep this comment\n[network]\nallow = [\"anthropic.com\"]\n";

fn world_with(policy: Option<&str>) -> (World, PathBuf) {
    let world = World::new();
    let repo = world.repo("app");
    if let Some(p) = policy {
        world.write(repo.join(".airlock.toml"), p);
    }
    (world, std::fs::canonicalize(repo).unwrap())
}

fn ago(secs: u64) -> String {
    rfc3339_ms(SystemTime::now() - Duration::from_secs(secs))
}

/// One audit line of `session`, `secs` ago; `extra` is spliced in as more JSON fields.
fn line(
    session: &str,
    secs: u64,
    host: &str,
    port: u16,
    allowed: bool,
    reason: &str,
    extra: &str,
) -> String {
    format!(
        r#"{{"ts":"{}","repo":"app","host":"{host}","method":"CONNECT","allowed":{allowed},"duration_ms":0,"id":"{session}-{host}-{port}-{secs}","session":"{session}","boot":"b1","seq":1,"port":{port},"reason":"{reason}","layer":"none"{extra}}}"#,
        ago(secs)
    )
}

/// Writes today's audit file (and a sessions file with a start record per `(session, secs)`).
fn plant(world: &World, lines: &[String], sessions: &[(&str, u64)]) -> PathBuf {
    let dir = world.home.join(".airlock/logs/app");
    let today = utc_date(SystemTime::now());
    let mut body = lines.join("\n");
    body.push('\n');
    world.write(dir.join(format!("audit-{today}.jsonl")), &body);
    let records: Vec<String> = sessions
        .iter()
        .map(|(s, secs)| {
            format!(
                r#"{{"id":"{s}:start","kind":"start","session":"{s}","ts":"{}","repo":"app"}}"#,
                ago(*secs)
            )
        })
        .collect();
    if !records.is_empty() {
        world.write(dir.join(format!("sessions-{today}.jsonl")), &(records.join("\n") + "\n"));
    }
    dir
}

fn learn(world: &World, repo: &Path, args: &[&str]) -> Run {
    world.airlock(repo).args(["policy", "learn"]).args(args).run()
}

fn trusted(world: &World, repo: &Path) -> bool {
    let run = world.airlock(repo).args(["policy", "show", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    v["layers"][2]["trust"]["state"] == "trusted"
}

fn refused_mix(session: &str) -> Vec<String> {
    vec![
        line(session, 60, "api.example.com", 443, false, "not_allowed", ""),
        line(session, 59, "cdn.example.com", 80, false, "not_allowed", ""),
        line(session, 58, "cdn.example.com", 443, false, "not_allowed", ""),
        line(session, 57, "solo.test", 443, false, "not_allowed", ""),
        line(session, 56, "git.corp.test", 2222, false, "not_allowed", ""),
        line(
            session,
            55,
            "api.anthropic.com",
            443,
            true,
            "allowed",
            r#","bytes_sent":1,"bytes_recv":2"#,
        ),
    ]
}

#[test]
fn learn_groups_by_domain_names_ports_only_when_needed_and_writes_nothing_without_yes() {
    let (world, repo) = world_with(Some(TRUSTED));
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    plant(&world, &refused_mix("s1"), &[("s1", 60)]);
    let file = repo.join(".airlock.toml");
    let run = learn(&world, &repo, &[]).expect_code(0);
    let out = run.stdout();
    assert!(out.contains("learning from session s1 (the repo's most recent"), "{out}");
    // Two hosts of example.com → the domain; one host → exactly it; 80/443 need no port.
    assert!(out.contains("  example.com "), "{out}");
    assert!(out.contains("covers api.example.com, cdn.example.com"), "{out}");
    assert!(out.contains("  =solo.test "), "{out}");
    assert!(out.contains("  =git.corp.test:2222 "), "{out}");
    assert!(!out.contains("example.com:443") && !out.contains("example.com:80 "), "{out}");
    assert!(out.contains("already allowed:\n  api.anthropic.com:443 (allowed 1 times)"), "{out}");
    // The diff against the file as it is, comments kept.
    assert!(
        out.contains(
            "+allow = [\"anthropic.com\", \"=git.corp.test:2222\", \"=solo.test\", \"example.com\"]"
        ),
        "{out}"
    );
    assert!(out.contains("not written: run again with --yes"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), TRUSTED);
    assert!(trusted(&world, &repo));
}

#[test]
fn learn_yes_writes_the_file_untrusted_and_policy_trust_then_trusts_it() {
    let (world, repo) = world_with(Some(TRUSTED));
    // A user entry keeps the allowlist non-empty while the edited repo file does not apply.
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"=unrelated.test\"]\n",
    );
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    plant(&world, &refused_mix("s1"), &[("s1", 60)]);
    let run = learn(&world, &repo, &["--yes"]).expect_code(0);
    assert!(run.stdout().contains("it is NOT trusted"), "{}", run.stdout());
    let text = std::fs::read_to_string(repo.join(".airlock.toml")).unwrap();
    assert!(text.starts_with("# team policy: keep this comment\n"), "{text}");
    assert!(text.contains("\"example.com\""), "{text}");
    assert!(!trusted(&world, &repo), "learn must never record trust");
    // Not applied: the edit is untrusted, the old trusted content no longer matches.
    world.airlock(&repo).args(["policy", "check", "api.example.com"]).run().expect_code(1);
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    world.airlock(&repo).args(["policy", "check", "api.example.com"]).run().expect_code(0);
    world.airlock(&repo).args(["policy", "check", "git.corp.test:2222"]).run().expect_code(0);
    // Learning again proposes nothing: every refusal is allowed now.
    let run = learn(&world, &repo, &[]).expect_code(0);
    assert!(run.stdout().contains("nothing to propose"), "{}", run.stdout());
    assert!(
        run.stdout().contains("api.example.com:443 (allowed now by rule \"example.com\""),
        "{}",
        run.stdout()
    );
}

#[test]
fn private_blocked_and_managed_refusals_are_not_proposed_without_private() {
    let (world, repo) = world_with(Some(TRUSTED));
    let lines = vec![
        line(
            "s1",
            9,
            "db.example.net",
            443,
            false,
            "private_address",
            r#","refused_addrs":["10.0.0.5"]"#,
        ),
        line("s1", 8, "pastebin.com", 443, false, "blocked", r#","rule":"pastebin.com""#)
            .replace(r#""layer":"none""#, r#""layer":"user""#),
        line("s1", 7, "x.example.org", 443, false, "managed_not_allowed", "")
            .replace(r#""layer":"none""#, r#""layer":"managed""#),
        line("s1", 6, "10.1.2.3", 8080, false, "ip_not_allowed", ""),
        line("s1", 5, "slow.example.org", 443, false, "resolve_failed", ""),
    ];
    plant(&world, &lines, &[("s1", 10)]);
    let file = repo.join(".airlock.toml");
    let run = learn(&world, &repo, &["--yes"]).expect_code(0);
    let out = run.stdout();
    assert!(out.contains("nothing to propose"), "{out}");
    assert!(
        out.contains(
            "db.example.net:443: not proposed: needs --private (private_address: 10.0.0.5"
        ),
        "{out}"
    );
    assert!(out.contains("10.1.2.3:8080: not proposed: needs --private"), "{out}");
    assert!(
        out.contains("pastebin.com:443: blocked by rule \"pastebin.com\" (user layer)"),
        "{out}"
    );
    assert!(
        out.contains("x.example.org:443: the managed layer's allow list does not include it"),
        "{out}"
    );
    assert!(out.contains("ignored: 1 refusals"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), TRUSTED);

    let run = learn(&world, &repo, &["--private", "--yes"]).expect_code(0);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("allow_private = [\"10.0.0.5/32\", \"10.1.2.3/32\"]"),
        "{text}\n{}",
        run.stdout()
    );
    assert!(text.contains("\"10.1.2.3:8080\""), "{text}");
    assert!(!text.contains("pastebin") && !text.contains("example.org"), "{text}");
}

#[test]
fn session_and_since_select_lines_and_exclude_each_other() {
    let (world, repo) = world_with(Some(TRUSTED));
    let lines = vec![
        line("old", 3 * 3600, "old.example.net", 443, false, "not_allowed", ""),
        line("new", 60, "new.example.net", 443, false, "not_allowed", ""),
    ];
    plant(&world, &lines, &[("old", 3 * 3600 + 5), ("new", 65)]);
    let out = learn(&world, &repo, &[]).expect_code(0).stdout();
    assert!(out.contains("=new.example.net") && !out.contains("old.example.net"), "{out}");
    let out = learn(&world, &repo, &["--session", "old"]).expect_code(0).stdout();
    assert!(out.contains("=old.example.net") && !out.contains("new.example.net"), "{out}");
    let out = learn(&world, &repo, &["--since", "1h"]).expect_code(0).stdout();
    assert!(out.contains("=new.example.net") && !out.contains("old.example.net"), "{out}");
    let out = learn(&world, &repo, &["--since", "1day"]).expect_code(0).stdout();
    // Two hosts of one registrable domain across sessions: one entry.
    assert!(out.contains("  example.net "), "{out}");
    let run = learn(&world, &repo, &["--session", "new", "--since", "1h"]).expect_code(2);
    assert!(run.stderr().contains("cannot be used with"), "{}", run.stderr());
    let out = learn(&world, &repo, &["--session", "nosuch"]).expect_code(0).stdout();
    assert!(out.contains("no audit lines selected"), "{out}");
}

#[test]
fn dns_suppressed_and_malformed_lines() {
    let (world, repo) = world_with(Some(TRUSTED));
    let dns = line(
        "s1",
        9,
        "a.dns.example",
        443,
        false,
        "not_allowed",
        r#","qtype":"A","answer":"NXDOMAIN""#,
    )
    .replace(r#""method":"CONNECT""#, r#""method":"DNS""#)
    .replace(r#","port":443"#, "");
    let suppressed =
        line("s1", 8, "b.dns.example", 443, false, "not_allowed", r#","seqs":[[2,41]],"count":40"#);
    let lines = vec![
        dns,
        "this is not json".to_owned(),
        r#"{"ts":"2026-01-01T00:00:00.000Z","host":"#.to_owned(),
        suppressed,
        r#"{"ts":"x","repo":"app","host":"c.test","allowed":"nope","session":"s1"}"#.to_owned(),
    ];
    plant(&world, &lines, &[("s1", 10)]);
    let run = learn(&world, &repo, &["--session", "s1"]).expect_code(0);
    let err = run.stderr();
    assert!(err.contains(":2: skipping a line that is not an audit line"), "{err}");
    assert!(err.contains(":3: skipping a line that is not an audit line"), "{err}");
    assert!(err.contains(":5: skipping a line that is not an audit line"), "{err}");
    let out = run.stdout();
    assert!(out.contains("  dns.example "), "{out}");
    assert!(out.contains("41 refused"), "{out}");
}

#[test]
fn no_log_and_nothing_to_learn_exit_0() {
    let (world, repo) = world_with(Some(TRUSTED));
    let run = learn(&world, &repo, &[]).expect_code(0);
    assert!(run.stdout().contains("nothing to learn"), "{}", run.stdout());
}

#[test]
fn a_repo_file_that_does_not_parse_is_a_configuration_error() {
    let (world, repo) = world_with(Some("[network]\nalow = []\n"));
    plant(&world, &refused_mix("s1"), &[("s1", 60)]);
    let run = learn(&world, &repo, &["--yes"]).expect_code(3);
    assert!(run.stderr().contains(".airlock.toml:2:1: unknown key `alow`"), "{}", run.stderr());
}

/// A real session: curl inside the sandbox reaches one loopback test name and is refused for
/// others; `policy learn` proposes entries from those real audit lines.
#[cfg(feature = "test-hooks")] // the test resolver and the activation harness
#[test]
fn learns_from_a_real_sandboxed_session() {
    use crate::harness::{Harness, Options};
    if !crate::support::have("curl") {
        return;
    }
    let (world, repo) = world_with(None);
    let (port, _) = crate::support::http_upstream("127.0.0.2", "upstream-ok\n");
    let resolver = world.write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    // Refused names are never resolved, so they need no resolver entry.
    let script = format!(
        "curl -sS -m 10 http://allowed.test:{port}/\n\
         curl -sS -m 10 -o /dev/null http://api.learn.test/ ; \
         curl -sS -m 10 -o /dev/null https://cdn.learn.test/ ; \
         curl -sS -m 10 -o /dev/null http://other.test:8080/ ; true\n"
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &script])
        .run();
    assert!(
        run.stdout().contains("upstream-ok"),
        "{}\n{}\n{}",
        run.stdout(),
        run.stderr(),
        h.log()
    );
    let lines = world.audit_lines("app");
    assert!(
        lines.iter().any(|l| l["host"] == "api.learn.test" && l["allowed"] == false),
        "{lines:?}"
    );

    let run = learn(&world, &repo, &["--yes"]).expect_code(0);
    let out = run.stdout();
    assert!(out.contains("the repo's most recent"), "{out}");
    assert!(out.contains("covers api.learn.test, cdn.learn.test"), "{out}");
    assert!(out.contains(&format!("allowed.test:{port} (allowed")), "{out}");
    let text = std::fs::read_to_string(repo.join(".airlock.toml")).unwrap();
    assert_eq!(text, "[network]\nallow = [\"=other.test:8080\", \"learn.test\"]\n");
    assert!(!trusted(&world, &repo));
    world.airlock(&repo).args(["policy", "check", "cdn.learn.test"]).run().expect_code(1);
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    world.airlock(&repo).args(["policy", "check", "cdn.learn.test"]).run().expect_code(0);
}

/// Refusals decided under a phase are decided with, and proposed into, that phase's lists
/// (`[phase.NAME.network] allow`), not `[network] allow`, which the phase replaces; a phase the
/// repo file does not define is not proposed.
#[test]
fn refusals_under_a_phase_are_proposed_into_that_phase_table() {
    let policy = "[network]\nallow = [\"anthropic.com\", \"github.com\"]\n\n[phase.deps.network]\nallow = [\"anthropic.com\"]\n";
    let (world, repo) = world_with(Some(policy));
    let deps = r#","phase":"deps""#;
    let lines = vec![
        line("s1", 9, "pypi.org", 443, false, "not_allowed", deps),
        // Allowed by the plain lists, refused in the phase: still proposed for the phase.
        line("s1", 8, "api.github.com", 443, false, "not_allowed", deps),
        line("s1", 7, "plain.test", 443, false, "not_allowed", ""),
        line("s1", 6, "other.test", 443, false, "not_allowed", r#","phase":"build""#),
    ];
    plant(&world, &lines, &[("s1", 10)]);
    let run = learn(&world, &repo, &["--session", "s1", "--yes"]).expect_code(0);
    let out = run.stdout();
    assert!(
        out.contains("proposed [phase.deps.network] allow entries (refused under phase deps):"),
        "{out}"
    );
    assert!(out.contains("proposed [network] allow entries:\n  =plain.test "), "{out}");
    assert!(out.contains("not proposed (refused under phase build):"), "{out}");
    assert!(out.contains("refused under phase build, which"), "{out}");
    let text = std::fs::read_to_string(repo.join(".airlock.toml")).unwrap();
    let (plain, phase) = text.split_once("[phase.deps.network]").unwrap();
    assert!(plain.contains("=plain.test") && !plain.contains("pypi"), "{text}");
    assert!(phase.contains("=pypi.org") && phase.contains("=api.github.com"), "{text}");
    assert!(!text.contains("other.test"), "{text}");
    // The diff shows the phase table's line changed.
    assert!(
        out.contains("+allow = [\"anthropic.com\", \"=api.github.com\", \"=pypi.org\"]"),
        "{out}"
    );
}
