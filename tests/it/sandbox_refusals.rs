//! Refusals a person can act on, in real sessions with the real `airlockd`: after the session
//! the host's stderr says what was refused, grouped, with the exact `airlock policy allow`
//! command (or the `allow_private` fix); `--quiet` silences it; the audit lines carry `rule`,
//! `reason`/`layer`/`policy` on allowed lines and `refused_addrs` on a private answer; and the
//! suggested command, run on the host, lets the next session through. Upstreams are loopback
//! servers; the test resolver maps the test names to 127.0.0.x.

use crate::harness::{Harness, Options};
use crate::support::{World, have, http_upstream, in_ci};

#[test]
fn a_session_ends_with_what_was_refused_and_the_command_that_allows_it() {
    if !have("curl") {
        assert!(!in_ci(), "curl is a CI prerequisite");
        return;
    }
    let world = World::new();
    let repo = world.repo("refusals");
    let (port, _hits) = http_upstream("127.0.0.2", "upstream-ok\n");
    let (private_port, private_hits) = http_upstream("127.0.0.3", "never\n");
    let resolver = world.write(
        world.tmp.path().join("resolver"),
        "allowed.test 127.0.0.2\nrefused.test 127.0.0.2\nprivate.test 127.0.0.3\n",
    );
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\", \"private.test:{private_port}\"]\n\
             allow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let exec = |extra: &[&str], script: &str| {
        world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec"])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .run()
    };
    let refused = format!(
        "curl -sS -m 10 http://allowed.test:{port}/\n\
         for i in 1 2 3; do curl -s -m 10 -o /dev/null http://refused.test:{port}/; done\n\
         curl -s -m 10 -o /dev/null https://refused.test/\n\
         curl -s -m 10 -o /dev/null http://private.test:{private_port}/\n\
         echo done\n"
    );

    // Session 1, unattributed (no `airlock login`): the warning, then the summary.
    let run = exec(&[], &refused).expect_code(0);
    assert_eq!(run.stdout(), "upstream-ok\ndone\n", "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("no `airlock login`"), "unattributed warning: {err}");
    // One line of single-spaced words (the message once carried a source line break's indent).
    assert!(err.contains("audit lines carry no user_id, so nobody"), "{err}");
    assert!(err.contains("--email YOU` (shown once for "), "{err}");
    assert!(err.contains(&format!("  refused.test:{port} not_allowed ×3\n")), "{err}");
    assert!(err.contains("  refused.test:443 not_allowed ×1\n"), "{err}");
    assert!(err.contains(&format!("  airlock policy allow refused.test:{port}\n")), "{err}");
    assert!(err.contains("  airlock policy allow refused.test\n"), "{err}");
    assert!(
        err.contains(&format!(
            "  private.test:{private_port} private_address ×1 — it resolved to 127.0.0.3"
        )) && err.contains("allow_private = [\"127.0.0.3\"]"),
        "the private answer's fix: {err}"
    );
    assert!(!err.contains("policy allow private.test"), "allowing it again fixes nothing: {err}");
    assert!(!err.contains("allowed.test"), "allowed attempts are not refusals: {err}");
    assert_eq!(private_hits.load(std::sync::atomic::Ordering::SeqCst), 0);

    // The audit lines behind it.
    let lines = world.audit_lines("refusals");
    let allowed = lines.iter().find(|l| l["allowed"] == true).unwrap();
    assert_eq!(allowed["reason"], "allowed", "{allowed}");
    assert_eq!(allowed["layer"], "user", "{allowed}");
    assert_eq!(allowed["policy"], "~/.airlock/config.toml", "{allowed}");
    assert_eq!(allowed["rule"], format!("allowed.test:{port}"), "{allowed}");
    let private = lines.iter().find(|l| l["reason"] == "private_address").unwrap();
    assert_eq!(private["refused_addrs"], serde_json::json!(["127.0.0.3"]), "{private}");
    assert!(private.get("rule").is_none(), "the guard, not an entry, refused: {private}");
    let denied = lines.iter().find(|l| l["reason"] == "not_allowed").unwrap();
    assert!(denied.get("rule").is_none(), "default deny names no entry: {denied}");

    // Session 2, --quiet: no summary; the unattributed warning was shown once for this repo.
    let run = exec(&["--quiet"], &refused).expect_code(0);
    let err = run.stderr();
    assert!(!err.contains("not_allowed"), "--quiet: {err}");
    assert!(!err.contains("policy allow"), "--quiet: {err}");
    assert!(!err.contains("no `airlock login`"), "warned once per repo: {err}");

    // The suggested command, run on the host; the next session is allowed, nothing refused.
    let allow = world
        .airlock(&repo)
        .args(["policy", "allow", &format!("refused.test:{port}"), "--yes"])
        .run()
        .expect_code(0);
    assert!(allow.stdout().contains("trusted; recorded in"), "{}", allow.stdout());
    let run = exec(&[], &format!("curl -sS -m 10 http://refused.test:{port}/\n")).expect_code(0);
    assert_eq!(run.stdout(), "upstream-ok\n", "{}", run.stderr());
    assert!(!run.stderr().contains("refused"), "nothing was refused: {}", run.stderr());
}

/// With the caller's terminal on a pty (the relay puts it in raw mode for the session), the
/// summary comes after the session's output and after the terminal was restored: its newlines
/// reach the terminal as `\r\n` (ONLCR is back on; in raw mode, with OPOST off, a bare `\n`
/// would arrive and the lines would stair-step).
#[test]
fn the_summary_is_printed_after_the_terminal_is_restored() {
    if !have("curl") {
        assert!(!in_ci(), "curl is a CI prerequisite");
        return;
    }
    let world = World::new();
    let repo = world.repo("refusals-tty");
    let resolver = world.write(world.tmp.path().join("resolver"), "");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"base.test\"]\n");
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "curl -s -m 10 -o /dev/null http://tty.test:81/; echo inside-done",
        ])
        .cmd;
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave.try_clone().unwrap()).stderr(slave);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let terminal = crate::support::PtyOutput::read(&master);
    let status = child.wait().unwrap();
    let seen = String::from_utf8_lossy(&terminal.until_closed()).into_owned();
    assert_eq!(status.code(), Some(0), "{seen:?}");
    let done = seen.find("inside-done").unwrap_or_else(|| panic!("{seen:?}"));
    let summary = seen.find("tty.test:81 not_allowed ×1").unwrap_or_else(|| panic!("{seen:?}"));
    assert!(done < summary, "the summary follows the session's output: {seen:?}");
    assert!(seen[summary..].contains("not_allowed ×1\r\n"), "cooked mode again: {seen:?}");
    assert!(seen.contains("  airlock policy allow tty.test:81\r\n"), "{seen:?}");
}
