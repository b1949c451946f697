//! Nothing is dropped silently. The one log subscriber (src/logging.rs) seen from outside: a
//! failing audit write in the daemon's proxy reaches the daemon's stderr, a bad `AIRLOCK_LOG`
//! is a clear error, and while the caller's terminal is raw the CLI's warnings go to
//! `~/.airlock/airlock.log`, never onto the terminal. And a transcript walk cut short at
//! session end is said in the session record. Upstreams are the test's own loopback servers;
//! the test resolver maps names.

use crate::support::World;
// The tests that need a test hook (resolver, harness overrides, the raw-terminal warning).
#[cfg(feature = "test-hooks")]
use {
    crate::harness::{Harness, Options},
    crate::support::{PtyOutput, Sandbox, have, wait_until},
    std::io::{Read, Write},
    std::net::TcpListener,
    std::os::unix::fs::PermissionsExt,
    std::process::Stdio,
    std::time::Duration,
};

#[cfg(feature = "test-hooks")]
/// An HTTP server on `ip` answering every request with a short body.
fn http_upstream(ip: &str) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                );
            });
        }
    });
    port
}

#[cfg(feature = "test-hooks")]
/// `YYYY-MM-DD` (UTC) of now plus `days`.
fn utc_date(days: u64) -> String {
    let t = std::time::SystemTime::now() + Duration::from_secs(days * 86_400);
    airlock::audit::utc_date(t)
}

#[cfg(feature = "test-hooks")] // the test resolver (AIRLOCK_TEST_RESOLVER)
#[test]
fn a_failing_audit_write_is_logged_on_the_daemons_stderr() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let repo = world.repo("auditfull");
    let port = http_upstream("127.0.0.2");
    let resolver = world.write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    // The audit files of today and tomorrow (a run across midnight) are a full disk: opening
    // them works, every write fails with ENOSPC.
    let logs = world.home.join(".airlock/logs/auditfull");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o700)).unwrap();
    for day in [0, 1] {
        std::os::unix::fs::symlink(
            "/dev/full",
            logs.join(format!("audit-{}.jsonl", utc_date(day))),
        )
        .unwrap();
    }
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args([
            "exec".to_owned(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            format!("curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://allowed.test:{port}/"),
        ])
        .run();
    // The attempt is journalled (that file is fine) and allowed; its audit line is not
    // written, and the daemon says so on its stderr.
    assert_eq!(run.stdout(), "200", "{}\n--- airlockd log\n{}", run.stderr(), h.log());
    let wanted = "cannot write the final audit line of ";
    assert!(
        wait_until(Duration::from_secs(10), || h.log().contains(wanted)),
        "{wanted:?} is not in the daemon's stderr:\n{}\n--- airlock\n{}",
        h.log(),
        run.stderr()
    );
    let line = h.log().lines().find(|l| l.contains(wanted)).unwrap().to_owned();
    assert!(line.contains(" ERROR airlock::proxy"), "{line}");
    assert!(line.contains("audit-") && line.contains("No space left on device"), "{line}");
}

#[test]
fn a_bad_airlock_log_is_an_error_naming_the_variable() {
    let world = World::new();
    let repo = world.repo("badlog");
    let run = world.airlock(&repo).env("AIRLOCK_LOG", "airlock=loud").args(["whoami"]).run();
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr().starts_with("airlock: AIRLOCK_LOG=\"airlock=loud\" is not a valid log filter"),
        "{}",
        run.stderr()
    );
    let run = world.airlock(&repo).env("AIRLOCK_LOG", "airlock=loud").args(["exec", "true"]).run();
    assert_eq!(run.code(), 125, "{}", run.stderr());
    let run = world.airlockd(&repo).env("AIRLOCK_LOG", "[{").run();
    assert_eq!(run.code(), 64, "{}", run.stderr());
    assert!(
        run.stderr().starts_with("airlockd: AIRLOCK_LOG=\"[{\" is not a valid"),
        "{}",
        run.stderr()
    );
}

#[cfg(feature = "test-hooks")] // the test hook that warns while the terminal is raw
#[test]
fn while_the_terminal_is_raw_cli_warnings_go_to_the_log_file_and_are_counted() {
    let sb = Sandbox::new("rawlog");
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    // stdin, stdout and stderr all on the terminal, as an agent's TUI has them: the relay
    // puts it in raw mode, and the test hook warns as soon as it has.
    let mut cmd = sb.exec(&["sh", "-c", "printf 'inside\\n'"]).cmd;
    cmd.env(airlock::logging::TEST_WARN_WHILE_RAW_VAR, "1");
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let terminal = PtyOutput::read(&master);
    let status = child.wait().unwrap();
    let seen = String::from_utf8_lossy(&terminal.until_closed()).into_owned();
    assert_eq!(status.code(), Some(0), "{seen}");
    assert!(seen.contains("inside"), "{seen}");
    assert!(!seen.contains("test hook"), "a warning reached the raw terminal: {seen:?}");
    assert!(
        seen.contains(
            "airlock: 1 warning during the session was written to ~/.airlock/airlock.log"
        ),
        "{seen:?}"
    );
    let file = sb.home().join(".airlock/airlock.log");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.trim_end()
            .ends_with("Z airlock: warning: test hook: a warning while the terminal is raw"),
        "{text}"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
}

#[cfg(feature = "test-hooks")] // the harness's test overrides
#[test]
fn a_transcript_walk_cut_short_is_said_in_the_session_record() {
    if !have("python3") {
        return;
    }
    let world = World::new();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let fakebin = world.tmp.path().join("fakebin");
    world.write_executable(
        fakebin.join("claude"),
        "#!/bin/sh\n# Stand-in for Claude Code: runs its first argument as a script.\nexec /bin/sh -c \"$1\"\n",
    );
    let repo = world.repo("manyfiles");
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(&world, Options::default());
    let limit = airlock::agent::home::WALK_MAX_ENTRIES;
    // One entry more than the walk looks at, all transcript-shaped.
    let script = format!(
        "python3 -c \"import os\nd = os.path.expanduser('~/.claude/projects/-many')\nos.makedirs(d)\n\
         for i in range({limit}):\n  open(os.path.join(d, '%06d.jsonl' % i), 'w').close()\"",
    );
    let path = format!("{}:{}", fakebin.display(), std::env::var("PATH").unwrap_or_default());
    let run = world
        .airlock(&repo)
        .env("PATH", path)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["run", "claude", "--", &script])
        .run();
    assert_eq!(run.code(), 0, "{}\n--- airlockd\n{}", run.stderr(), h.log());
    // The CLI warned (after the session, not while the terminal was raw).
    assert!(run.stderr().contains("the rest were not hashed"), "{}", run.stderr());
    let recs = world.session_records("manyfiles");
    let end = recs.iter().find(|r| r["kind"] == "end");
    let end = end.unwrap_or_else(|| panic!("no end record: {recs:?}\n--- airlockd\n{}", h.log()));
    assert!(end.get("end_reason").is_none(), "the end record was not lost: {}", end["end_reason"]);
    assert_eq!(end["transcripts_truncated"], true);
    assert_eq!(end["transcript_entries_walked"], limit as u64);
    // One entry is the `-many` directory; the list stops at its byte budget, the rest counted.
    let listed = end["transcripts"].as_array().unwrap().len() as u64;
    let unlisted = end["transcripts_unlisted"].as_u64().unwrap();
    assert!(listed > 10, "{listed}");
    assert_eq!(listed + unlisted, limit as u64 - 1);
}
