//! Bounded audit volume without losing count (issue 14): a refusal flood against the real
//! proxy writes bounded lines whose individual lines plus `suppressed` counts equal the
//! attempts exactly, every `seq` held once; `[audit]` in a repo file is an error at
//! file:line:col. Loopback only: the flood's target is refused by policy and never resolved.

use std::io::Write;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::proxy_support::{ProxyProc, read_head};
use crate::support::World;

/// Attempts the flood makes (four clients, a new connection each, like a retry loop).
const ATTEMPTS: u64 = 4000;
/// The default `[audit] burst`.
const BURST: u64 = 20;

#[test]
fn a_refusal_flood_is_bounded_and_loses_no_count() {
    let world = World::new();
    let proxy = ProxyProc::start(
        &world,
        "flood",
        "[network]\nallow = [\"allowed.test\"]\n",
        "allowed.test 127.0.0.9\n",
        &[],
    );
    let started = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                for _ in 0..ATTEMPTS / 4 {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    s.write_all(b"CONNECT flood.test:443 HTTP/1.1\r\nHost: flood.test:443\r\n\r\n")
                        .unwrap();
                    let head = read_head(&mut s);
                    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let secs = started.elapsed().as_secs() + 1;
    // Graceful shutdown: the drain writes what is still pending.
    let mut proxy = proxy;
    let status = proxy.signal_and_wait(Signal::SIGTERM);
    assert!(status.success(), "{status:?}\n{}", proxy.stderr.lock().unwrap());

    let lines = proxy.audit();
    let (summaries, singles): (Vec<&Value>, Vec<&Value>) =
        lines.iter().partition(|l| l.get("seqs").is_some());
    let mut seen = vec![0u32; ATTEMPTS as usize + 1];
    for l in &singles {
        assert_eq!(l["host"], "flood.test", "{l}");
        assert_eq!(l["reason"], "not_allowed", "{l}");
        seen[l["seq"].as_u64().unwrap() as usize] += 1;
    }
    let mut suppressed = 0;
    for s in &summaries {
        assert_eq!(
            (&s["host"], &s["reason"], &s["allowed"]),
            (&"flood.test".into(), &"not_allowed".into(), &false.into()),
            "{s}"
        );
        let mut n = 0;
        for r in s["seqs"].as_array().unwrap() {
            let (a, b) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            assert!(a <= b, "{s}");
            (a..=b).for_each(|q| seen[q as usize] += 1);
            n += b - a + 1;
        }
        assert_eq!(s["count"].as_u64(), Some(n), "count is the ranges' size: {s}");
        suppressed += n;
    }
    assert_eq!(singles.len() as u64 + suppressed, ATTEMPTS, "lines + suppressed counts = attempts");
    assert!(seen[1..].iter().all(|&n| n == 1), "every seq 1..={ATTEMPTS} held exactly once");
    // Bounded: at most `burst` individual lines per (host, reason) and second of the flood.
    assert!(
        singles.len() as u64 <= BURST * (secs + 1),
        "{} individual lines in about {secs} s",
        singles.len()
    );
    assert!(summaries.len() < singles.len() + 100, "{} summaries", summaries.len());
}

#[test]
fn audit_settings_in_a_repo_file_are_an_error_naming_file_line_col() {
    let world = World::new();
    let repo = world.repo("app");
    let file = world.write(
        repo.join(".airlock.toml"),
        "[network]\nallow = [\"corp.test\"]\n[audit]\nburst = 0\n",
    );
    let repo = std::fs::canonicalize(repo).unwrap();
    let file = repo.join(file.file_name().unwrap());
    let run = world.airlock(&repo).args(["policy", "trust"]).run().expect_code(3);
    assert!(
        run.stderr().contains(&format!(
            "airlock: {}:3:2: [audit] is not allowed in the repo layer",
            file.display()
        )),
        "{}",
        run.stderr()
    );
    // The same keys in ~/.airlock/config.toml are accepted.
    world.write(repo.join(".airlock.toml"), "[network]\nallow = [\"corp.test\"]\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[audit]\nburst = 5\nsession_budget = \"64MiB\"\nmin_free = 1048576\n",
    );
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    world.airlock(&repo).args(["policy", "check", "corp.test"]).run().expect_code(0);
}

/// Through `airlockd review` (embedded store, then PostgreSQL): a `suppressed` line's `seqs`
/// are present for the session gap check and counted exactly by the denial-burst rule;
/// without it, the same session has a gap.
#[test]
fn the_review_plane_treats_suppressed_seqs_as_present_and_counts_them() {
    use crate::review_support::*;
    let world = World::new();
    review_plane_case(&world, StoreSel::Embedded(world.tmp.path().join("d")));
    if let Some(db) = PgDb::create() {
        let world = World::new();
        db.migrate(&world);
        review_plane_case(&world, StoreSel::Pg(db.runtime_url.clone()));
    }
}

fn review_plane_case(world: &World, store: crate::review_support::StoreSel) {
    use crate::review_support::*;
    use serde_json::json;

    let store = &store;
    let tok = user_with_token(world, store, "ana@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let record = |session: &str, kind: &str, ts: &str| {
        json!({"id": format!("{session}:{kind}"), "source": "session", "type": kind, "ts": ts,
               "session": session, "payload": {"id": format!("{session}:{kind}"), "ts": ts}})
    };
    let denied = |session: &str, id: &str, seq: u64, extra: Value| {
        let mut e = egress(id, "flood.test", false);
        e["session"] = json!(session);
        e["seq"] = json!(seq);
        e["ts"] = json!("2026-03-04T09:00:01Z");
        e["payload"]["seq"] = json!(seq);
        e["payload"]["reason"] = json!("not_allowed");
        for (k, v) in extra.as_object().unwrap() {
            e["payload"][k] = v.clone();
        }
        e
    };
    let session = |name: &str, with_summary: bool| {
        let mut evs = vec![
            record(name, "start", "2026-03-04T09:00:00Z"),
            denied(name, &format!("{name}-1"), 1, json!({})),
        ];
        if with_summary {
            evs.push(denied(
                name,
                &format!("{name}-2-suppressed"),
                2,
                json!({"seqs": [[2, 30], [32, 40]], "count": 38}),
            ));
            evs.push(denied(name, &format!("{name}-31"), 31, json!({})));
        }
        evs.push(denied(name, &format!("{name}-41"), 41, json!({})));
        evs.push(record(name, "end", "2026-03-04T09:10:00Z"));
        evs
    };
    let post = |name: &str, evs: &[Value]| {
        let f = write_file(world.tmp.path(), name, &ndjson(evs));
        assert_eq!(post_events(&server.base, &tok, &f, "application/x-ndjson", &[]).status, 200);
    };
    let flags = || -> Vec<Value> {
        get(&server.base, &tok, "/api/v1/flags?limit=1000", &[]).json()["flags"]
            .as_array()
            .unwrap()
            .clone()
    };
    post("with.ndjson", &session("s-sum", true));
    let got = flags();
    let rules: Vec<&str> = got.iter().map(|f| f["rule_id"].as_str().unwrap()).collect();
    assert_eq!(rules, vec!["egress.denial-burst"], "{got:#?}");
    assert_eq!(got[0]["detail"], "41 denials within 60 s", "counted exactly: {got:#?}");

    // The same session without its summary: 2-30 and 32-40 are missing, and 3 denials are no
    // burst.
    post("without.ndjson", &session("s-lost", false));
    let got = flags();
    let gap: Vec<&Value> = got.iter().filter(|f| f["session"] == "s-lost").collect();
    assert_eq!(gap.len(), 1, "{got:#?}");
    assert_eq!(gap[0]["rule_id"], "session.seq-gap");
    assert!(gap[0]["detail"].as_str().unwrap().ends_with("missing seq 2-40"), "{gap:#?}");
}

/// The processes on this host whose command line contains `marker` (a sandbox's processes are
/// visible from the host's PID namespace).
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!("{}: {cmdline}", name.to_string_lossy()));
        }
    }
    found
}

/// A session script: a sleeper in the background (its argument is `marker`, 30.x seconds), a
/// note in the repo that it started, then `flood` (shell), then waiting for the sleeper.
/// Without a stop the session would end after 30 seconds with status 0.
fn stoppable_script(marker: &str, flood: &str) -> String {
    format!("sleep {marker} &\necho started > started\n{flood}\nwait\necho not-stopped\n")
}

/// `[audit] session_budget` (user layer): a session flooding refusals writes its budget, is
/// stopped — one final `STOP` line with reason `audit_budget` — and `airlock exec` kills the
/// sandbox (the background sleeper is gone), says why on stderr and exits 124. The flood's
/// name is refused by policy, never resolved or dialed.
#[test]
fn past_the_session_budget_the_session_is_stopped_and_its_sandbox_killed() {
    use crate::harness::{Harness, Options};
    if !crate::support::have("curl") {
        return;
    }
    let world = World::new();
    let repo = world.repo("budget");
    let resolver = world.write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.9\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"allowed.test\"]\n[audit]\nburst = 0\nsession_budget = 4096\n",
    );
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let marker = format!("30.{:07}1", std::process::id());
    let flood = "for i in $(seq 1 400); do curl -s -o /dev/null -m 5 http://flood.test/; done";
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &stoppable_script(&marker, flood)])
        .run();
    assert_eq!(
        run.code(),
        124,
        "stdout:\n{}\nstderr:\n{}\n--- airlockd log\n{}",
        run.stdout(),
        run.stderr(),
        h.log()
    );
    assert!(
        run.stderr().contains(
            "airlock: session stopped: it wrote its audit budget of 4096 bytes \
             ([audit] session_budget); see what flooded the log with `airlock logs`"
        ),
        "{}",
        run.stderr()
    );
    assert!(!run.stdout().contains("not-stopped"), "{}", run.stdout());
    assert!(repo.join("started").exists(), "the sleeper never started: {}", run.stderr());
    let left = processes_with(&marker);
    assert!(left.is_empty(), "the sandbox's processes outlived the stop: {left:?}");

    let lines = world.audit_lines("budget");
    let finals: Vec<&Value> = lines.iter().filter(|l| l["method"] == "STOP").collect();
    assert_eq!(finals.len(), 1, "{lines:#?}");
    assert_eq!(
        (&finals[0]["reason"], &finals[0]["allowed"], &finals[0]["host"]),
        (&"audit_budget".into(), &false.into(), &"".into())
    );
    let end = world.session_records("budget").into_iter().find(|r| r["kind"] == "end").unwrap();
    assert_eq!((&end["end_reason"], &end["exit_status"]), (&"audit_budget".into(), &124.into()));
}

/// `[audit] min_free`: a running session whose audit log's file system drops below it (the
/// test-hooks free-space file, re-read at every check) is stopped — final line `low_space` —
/// and `airlock exec` kills its sandbox and exits 124 saying why. No traffic needed.
#[test]
fn low_space_stops_a_running_session_and_kills_its_sandbox() {
    use crate::harness::{Harness, Options};
    let world = World::new();
    let repo = world.repo("lowspace");
    let free = world.write(world.tmp.path().join("free-bytes"), "1099511627776\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"allowed.test\"]\n[audit]\nmin_free = 1048576\n",
    );
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_FREE_BYTES_FILE".into(), free.clone().into())],
            ..Default::default()
        },
    );
    let marker = format!("30.{:07}2", std::process::id());
    let cmd = world.airlock(&repo).env("AIRLOCK_SOCKET", h.socket()).args([
        "exec",
        "--",
        "sh",
        "-c",
        &stoppable_script(&marker, ""),
    ]);
    let session = std::thread::spawn(move || cmd.run());
    // The command may start before the daemon took the session: wait for its start record
    // (written after the start's free-space check) too.
    let registered = || world.session_records("lowspace").iter().any(|r| r["kind"] == "start");
    assert!(
        crate::support::wait_until(Duration::from_secs(60), || repo.join("started").exists()
            && registered()),
        "the session never started:\n{}",
        h.log()
    );
    // Space runs out while the session runs.
    world.write(&free, "1000\n");
    let run = session.join().unwrap();
    assert_eq!(
        run.code(),
        124,
        "stdout:\n{}\nstderr:\n{}\n--- airlockd log\n{}",
        run.stdout(),
        run.stderr(),
        h.log()
    );
    assert!(
        run.stderr().contains("airlock: session stopped: the file system of the audit log (")
            && run.stderr().contains("has less than [audit] min_free (1048576 bytes) free"),
        "{}",
        run.stderr()
    );
    assert!(!run.stdout().contains("not-stopped"), "{}", run.stdout());
    let left = processes_with(&marker);
    assert!(left.is_empty(), "the sandbox's processes outlived the stop: {left:?}");
    let lines = world.audit_lines("lowspace");
    let finals: Vec<&Value> = lines.iter().filter(|l| l["method"] == "STOP").collect();
    assert_eq!(finals.len(), 1, "{lines:#?}");
    assert_eq!(finals[0]["reason"], "low_space");
}
