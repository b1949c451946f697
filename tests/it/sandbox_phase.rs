//! Phases (`[phase.NAME.network]`, issue 20) with the real `airlock` and `airlockd`: a session
//! started with `--phase` is decided by the phase's lists, `airlock phase set` switches a live
//! session from the host (never from inside), and every switch is a `phase` audit line between
//! the attempts it separates and an entry of the session's end record. Upstreams are loopback
//! servers of the test's own; the test resolver maps the test names to them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{Harness, Options};
use crate::support::{World, have, wait_until};

/// A world whose user layer allows `plain.test` and whose phase `build` allows `build.test`
/// instead (both names resolve to one loopback upstream); phase `empty` only blocks.
struct Phased {
    world: World,
    repo: PathBuf,
    port: u16,
    h: Harness,
}

fn phased(name: &str) -> Phased {
    let world = World::new();
    let repo = world.repo(name);
    let port = crate::support::http_upstream("127.0.0.2", "upstream-ok\n").0;
    let resolver = world
        .write(world.tmp.path().join("resolver"), "plain.test 127.0.0.2\nbuild.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"plain.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n\
             [phase.build.network]\nallow = [\"build.test:{port}\"]\n\
             [phase.empty.network]\nblock = [\"plain.test\"]\n"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    Phased { world, repo, port, h }
}

impl Phased {
    fn airlock(&self, args: &[&str]) -> crate::support::Run {
        self.world.airlock(&self.repo).env("AIRLOCK_SOCKET", self.h.socket()).args(args).run()
    }

    /// `airlock exec [PRE...] -- sh -c SCRIPT` in a thread of its own.
    fn exec_bg(&self, pre: &[&str], script: &str) -> std::thread::JoinHandle<crate::support::Run> {
        let mut args: Vec<String> = vec!["exec".into()];
        args.extend(pre.iter().map(|s| s.to_string()));
        args.extend(["--".into(), "sh".into(), "-c".into(), script.into()]);
        let cmd = self.world.airlock(&self.repo).env("AIRLOCK_SOCKET", self.h.socket()).args(args);
        std::thread::spawn(move || cmd.run())
    }

    fn curl(&self, host: &str, tag: &str) -> String {
        format!(
            "curl -s -m 10 -o /dev/null -w '{tag}:%{{http_code}}\\n' http://{host}:{}/\n",
            self.port
        )
    }

    fn lines(&self) -> Vec<serde_json::Value> {
        let name = self.repo.file_name().unwrap().to_str().unwrap().to_owned();
        let mut lines = self.world.audit_lines(&name);
        lines.sort_by_key(|l| l["seq"].as_u64());
        lines
    }

    fn records(&self) -> Vec<serde_json::Value> {
        let name = self.repo.file_name().unwrap().to_str().unwrap();
        self.world.session_records(name)
    }
}

/// Inside: touch `$AIRLOCK_REPO/<mark>`, then wait (at most ~60 s) for `$AIRLOCK_REPO/<go>`.
fn handshake(mark: &str, go: &str) -> String {
    format!(
        "touch \"$AIRLOCK_REPO/{mark}\"\n\
         i=0; while [ ! -e \"$AIRLOCK_REPO/{go}\" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n"
    )
}

fn wait_file(path: &Path) {
    assert!(
        wait_until(Duration::from_secs(60), || path.exists()),
        "{} never appeared",
        path.display()
    );
}

/// (host, allowed, phase) of the attempts and `PHASE` of the switch lines, in `seq` order.
fn story(lines: &[serde_json::Value]) -> Vec<(String, bool, Option<String>)> {
    lines
        .iter()
        .filter(|l| l["method"] != "DNS")
        .map(|l| {
            let host = if l["method"] == "PHASE" {
                format!("PHASE by {}", l["by"].as_str().unwrap_or("?"))
            } else {
                l["host"].as_str().unwrap().to_owned()
            };
            (host, l["allowed"] == true, l["phase"].as_str().map(str::to_owned))
        })
        .collect()
}

fn s(host: &str, allowed: bool, phase: Option<&str>) -> (String, bool, Option<String>) {
    (host.to_owned(), allowed, phase.map(str::to_owned))
}

#[test]
fn a_session_started_in_a_phase_is_decided_by_its_lists_and_records_it() {
    if !have("curl") {
        return;
    }
    let p = phased("phase-start");
    let both = format!("{}{}", p.curl("build.test", "build"), p.curl("plain.test", "plain"));
    let run = p.exec_bg(&["--phase", "build"], &both).join().unwrap();
    assert_eq!(run.expect_code(0).stdout(), "build:200\nplain:403\n", "{}", p.h.log());
    // The reverse without a phase: the plain lists.
    let run = p.exec_bg(&[], &both).join().unwrap();
    assert_eq!(run.expect_code(0).stdout(), "build:403\nplain:200\n");

    let lines = p.lines();
    let first = lines.iter().find(|l| l["method"] == "PHASE").unwrap()["session"].clone();
    let first = first.as_str().unwrap().to_owned();
    let (one, two): (Vec<_>, Vec<_>) = lines.iter().cloned().partition(|l| l["session"] == first);
    assert_eq!(
        story(&one),
        [
            s("PHASE by start", false, Some("build")),
            s("build.test", true, Some("build")),
            s("plain.test", false, Some("build")),
        ],
        "{one:#?}"
    );
    let switch = &one[0];
    assert_eq!((switch["seq"].as_u64(), switch["host"].as_str()), (Some(1), Some("")));
    assert!(switch.get("previous").is_none() && switch["user_id"].is_string(), "{switch}");
    assert_eq!(one[2]["reason"], "not_allowed");
    assert_eq!(
        story(&two),
        [s("build.test", false, None), s("plain.test", true, None)],
        "{two:#?}"
    );

    let records = p.records();
    let start = records.iter().find(|r| r["kind"] == "start" && r["session"] == first).unwrap();
    assert_eq!(start["phase"], "build", "{start}");
    let end = records.iter().find(|r| r["kind"] == "end" && r["session"] == first).unwrap();
    assert_eq!(end["phases"][0]["phase"], "build", "{end}");
    assert_eq!(end["phases"][0]["by"], "start");
    assert_eq!(end["phases"][0]["seq"], 1);
    let other = records.iter().filter(|r| r["session"] != first.as_str());
    assert!(other.into_iter().all(|r| r.get("phase").is_none() && r.get("phases").is_none()));

    // `airlock logs` shows the switch readably, and the phase of each decision.
    let logs = p.airlock(&["logs"]).expect_code(0).stdout();
    assert!(logs.contains("PHASE") && logs.contains("phase build (was (none)) by start"), "{logs}");
    assert!(
        logs.lines().any(|l| l.contains("plain.test") && l.contains("[phase build]")),
        "{logs}"
    );
}

#[test]
fn unknown_and_empty_phases_start_nothing() {
    if !have("curl") {
        return;
    }
    let p = phased("phase-unknown");
    let run = p.airlock(&["exec", "--phase", "biuld", "--", "true"]).expect_code(125);
    let err = run.stderr();
    assert!(err.contains("unknown phase \"biuld\"") && err.contains("build ("), "{err}");
    assert!(err.contains("empty ("), "every defined phase is listed: {err}");
    // Its allowlist would be empty: refused by the daemon, nothing started.
    let run = p.airlock(&["exec", "--phase", "empty", "--", "true"]).expect_code(125);
    assert!(run.stderr().contains("refusing to enter phase \"empty\""), "{}", run.stderr());
    assert!(p.lines().is_empty(), "{:?}", p.lines());
    assert!(p.records().is_empty(), "{:?}", p.records());
}

/// Inside, an attempt is refused; the host switches the live session (the repo's only one) to
/// `build`; the same attempt is then allowed. The switch line sits between the two in `seq`
/// order, each line names its phase, and the end record lists the switch. The layers are those
/// the session started with: the repo file, edited and re-trusted meanwhile so that its
/// `build` phase no longer allows build.test, is not re-read.
#[test]
fn phase_set_switches_a_live_session_with_the_layers_it_started_with() {
    if !have("curl") {
        return;
    }
    let p = phased("phase-live");
    let file = p.repo.join(".airlock.toml");
    let port = p.port;
    // Here only the repo's `build` phase allows build.test.
    p.world.write(
        p.world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"plain.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n\
             [phase.build.network]\nallow = [\"plain.test:{port}\"]\n\
             [phase.empty.network]\nblock = [\"plain.test\"]\n"
        ),
    );
    p.world.write(&file, &format!("[phase.build.network]\nallow = [\"build.test:{port}\"]\n"));
    p.airlock(&["policy", "trust"]).expect_code(0);
    let script = format!(
        "{}{}{}",
        p.curl("build.test", "before"),
        handshake("ready", "go"),
        p.curl("build.test", "after")
    );
    let session = p.exec_bg(&[], &script);
    wait_file(&p.repo.join("ready"));
    // Mid-session: the repo's phase now allows only plain.test, and is trusted so.
    p.world.write(&file, &format!("[phase.build.network]\nallow = [\"plain.test:{port}\"]\n"));
    p.airlock(&["policy", "trust"]).expect_code(0);
    let show = p.airlock(&["phase", "show"]).expect_code(0).stdout();
    assert!(show.contains(": no phase (defined: build, empty)"), "{show}");
    let set = p.airlock(&["phase", "set", "build"]).expect_code(0).stdout();
    assert!(set.contains(": phase build (was (none)); audit line seq "), "{set}");
    let show = p.airlock(&["phase", "show", "--json"]).expect_code(0).stdout();
    let show: serde_json::Value = serde_json::from_str(&show).unwrap();
    assert_eq!(show["sessions"][0]["phase"], "build", "{show}");
    let status = p.airlock(&["status"]).expect_code(0).stdout();
    assert!(status.contains("  phase build"), "{status}");
    p.world.write(p.repo.join("go"), "");
    let run = session.join().unwrap();
    assert_eq!(run.expect_code(0).stdout(), "before:403\nafter:200\n", "{}", p.h.log());

    let lines = p.lines();
    assert_eq!(
        story(&lines),
        [
            s("build.test", false, None),
            s("PHASE by cli", false, Some("build")),
            s("build.test", true, Some("build")),
        ],
        "{lines:#?}"
    );
    let switch = &lines.iter().find(|l| l["method"] == "PHASE").unwrap();
    assert!(switch.get("previous").is_none(), "{switch}");
    assert_eq!(lines[2]["rule"], format!("build.test:{port}"));
    assert!(lines[2]["policy"].as_str().unwrap().ends_with(".airlock.toml"), "{:?}", lines[2]);
    let end = p.records().into_iter().find(|r| r["kind"] == "end").unwrap();
    let phases = end["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 1, "{end}");
    assert_eq!((&phases[0]["phase"], &phases[0]["by"]), (&"build".into(), &"cli".into()));
    assert_eq!(phases[0]["seq"], switch["seq"]);
    assert!(p.records().iter().all(|r| r.get("phase").is_none()), "no start phase");
}

/// `phase set` picks the repo's only live session: with none it says so, with two it names
/// both and asks for `--session`; an unknown phase names the defined ones; `--none` goes back
/// to the plain lists.
#[test]
fn phase_set_needs_exactly_one_live_session_or_an_id() {
    if !have("curl") {
        return;
    }
    let p = phased("phase-default");
    let run = p.airlock(&["phase", "set", "build"]).expect_code(1);
    assert!(run.stderr().contains("no live session in "), "{}", run.stderr());
    assert!(run.stderr().contains("--session"), "{}", run.stderr());

    let script = |n: &str| {
        format!("{}{}", handshake(&format!("ready{n}"), &format!("go{n}")), p.curl("plain.test", n))
    };
    let a = p.exec_bg(&["--phase", "build"], &script("a"));
    let b = p.exec_bg(&[], &script("b"));
    wait_file(&p.repo.join("readya"));
    wait_file(&p.repo.join("readyb"));
    // Both sessions are live; the daemon lists them once they registered. (Where tests share
    // one daemon, as the unprivileged CI run does, another test may restart it; a live
    // session then registers again with the new one.)
    let mut status = serde_json::Value::Null;
    let listed = wait_until(Duration::from_secs(30), || {
        let out = p.airlock(&["status", "--json"]).expect_code(0).stdout();
        status = serde_json::from_str(&out).unwrap();
        status["sessions"].as_array().is_some_and(|s| s.len() == 2)
    });
    assert!(listed, "two live sessions: {status}");
    let ids: Vec<String> = status["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_owned())
        .collect();
    let run = p.airlock(&["phase", "set", "build"]).expect_code(1);
    let err = run.stderr();
    assert!(err.contains("2 live sessions") && err.contains("--session"), "{err}");
    assert!(ids.iter().all(|id| err.contains(id.as_str())), "{err}");
    let in_build = status["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["phase"] == "build")
        .map(|s| s["session"].as_str().unwrap().to_owned())
        .unwrap();
    let run = p.airlock(&["phase", "set", "nope", "--session", &in_build]).expect_code(1);
    assert!(run.stderr().contains("unknown phase \"nope\""), "{}", run.stderr());
    assert!(
        run.stderr().contains("build (") && run.stderr().contains("empty ("),
        "{}",
        run.stderr()
    );
    let run = p.airlock(&["phase", "set", "--none", "--session", &in_build]).expect_code(0);
    assert!(run.stdout().contains("phase (none) (was build)"), "{}", run.stdout());
    p.world.write(p.repo.join("goa"), "");
    p.world.write(p.repo.join("gob"), "");
    assert_eq!(a.join().unwrap().expect_code(0).stdout(), "a:200\n", "plain lists again");
    assert_eq!(b.join().unwrap().expect_code(0).stdout(), "b:200\n");
    let back = p
        .lines()
        .into_iter()
        .find(|l| l["method"] == "PHASE" && l["by"] == "cli")
        .expect("the switch back has its line");
    assert_eq!((back.get("phase"), &back["previous"]), (None, &"build".into()), "{back}");
    // After the sessions: none again.
    p.airlock(&["phase", "clear"]).expect_code(1);
}

/// The control socket is out of reach inside the sandbox, so `airlock phase set` run there
/// (the real binary, copied into the repo) fails, writes no line and changes nothing; the same
/// command from the host then switches that session (the positive control).
#[test]
fn phase_set_from_inside_the_sandbox_is_impossible() {
    if !have("curl") {
        return;
    }
    let p = phased("phase-inside");
    let inside = p.repo.join("airlock-inside");
    if std::fs::hard_link(crate::support::bin("airlock"), &inside).is_err() {
        std::fs::copy(crate::support::bin("airlock"), &inside).unwrap();
    }
    let sock = p.h.socket().display().to_string();
    let script = format!(
        "\"$AIRLOCK_REPO/airlock-inside\" phase set build >/dev/null 2>&1; echo \"set:$?\"\n\
         AIRLOCK_SOCKET={sock} \"$AIRLOCK_REPO/airlock-inside\" phase set build >/dev/null 2>&1; echo \"sock:$?\"\n{}{}{}",
        p.curl("build.test", "build"),
        handshake("ready", "go"),
        p.curl("build.test", "host")
    );
    let session = p.exec_bg(&[], &script);
    wait_file(&p.repo.join("ready"));
    let show = p.airlock(&["phase", "show"]).expect_code(0).stdout();
    assert!(show.contains(": no phase"), "nothing inside changed the phase: {show}");
    p.airlock(&["phase", "set", "build"]).expect_code(0);
    p.world.write(p.repo.join("go"), "");
    let out = session.join().unwrap().expect_code(0).stdout();
    assert!(!out.contains("set:0\n") && !out.contains("sock:0\n"), "{out}");
    assert!(out.ends_with("build:403\nhost:200\n"), "{out}");
    let lines = p.lines();
    assert_eq!(
        story(&lines),
        [
            s("build.test", false, None),
            s("PHASE by cli", false, Some("build")),
            s("build.test", true, Some("build")),
        ],
        "only the host's switch: {lines:#?}"
    );
}

/// An untrusted repo file contributes nothing, its phases included; the parser locates bad
/// phase blocks.
#[test]
fn untrusted_repo_phases_do_not_apply_and_bad_blocks_are_located() {
    let world = World::new();
    let repo = world.repo("phase-untrusted");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"a.test\"]\n[phase.build.network]\nallow = [\"b.test\"]\n",
    );
    world.write(repo.join(".airlock.toml"), "[phase.repo-only.network]\nallow = [\"c.test\"]\n");
    let list = world.airlock(&repo).args(["phase", "list", "--json"]).run().expect_code(0);
    let list: serde_json::Value = serde_json::from_str(&list.stdout()).unwrap();
    let names: Vec<&str> =
        list["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(names, ["build"], "{list}");
    let text = world.airlock(&repo).args(["phase", "list"]).run().expect_code(0).stdout();
    assert!(text.contains("is not trusted, so its phases do not apply"), "{text}");
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    let list = world.airlock(&repo).args(["phase", "list", "--json"]).run().expect_code(0);
    assert!(list.stdout().contains("\"repo-only\""), "trusted, it applies: {}", list.stdout());

    // `policy check --phase` decides under the phase (pure: nothing is resolved).
    let check = |args: &[&str]| world.airlock(&repo).args(["policy", "check"]).args(args).run();
    check(&["b.test"]).expect_code(1);
    check(&["b.test", "--phase", "build"]).expect_code(0);
    check(&["a.test", "--phase", "build"]).expect_code(1);
    // The repo layer defines no `build`: its (empty) [network] lists apply; in `repo-only` the
    // user layer keeps its own lists.
    check(&["c.test", "--phase", "repo-only"]).expect_code(0);
    check(&["a.test", "--phase", "repo-only"]).expect_code(0);
    let run = check(&["a.test", "--phase", "nope"]).expect_code(3);
    assert!(run.stderr().contains("unknown phase \"nope\""), "{}", run.stderr());
    let show = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0).stdout();
    assert!(show.contains("  phases: build: allow [b.test] block []"), "{show}");
    assert!(show.contains("  phases: repo-only: allow [c.test] block []"), "{show}");

    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"a.test\"]\n[phase.Build.network]\nallow = [\"b.test\"]\n\
         [phase.ok.network]\nalow = [\"b.test\"]\n",
    );
    let run = world.airlock(&repo).args(["policy", "check", "a.test"]).run().expect_code(3);
    let err = run.stderr();
    assert!(err.contains("config.toml:3:8: phase name \"Build\" is not valid"), "{err}");
    assert!(
        err.contains(
            "config.toml:6:1: unknown key `alow` in [phase.ok.network]; did you mean `allow`?"
        ),
        "{err}"
    );
}

/// The standalone proxy takes a phase for its whole run (`airlockd proxy --phase`): its
/// operator file's phase lists decide, and every line names the phase.
#[test]
fn the_standalone_proxy_runs_in_a_phase() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let port = crate::support::http_upstream("127.0.0.2", "upstream-ok\n").0;
    let proxy = crate::proxy_support::ProxyProc::start(
        &world,
        "phased",
        &format!(
            "[network]\nallow = [\"plain.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n\
             [phase.build.network]\nallow = [\"build.test:{port}\"]\n"
        ),
        "plain.test 127.0.0.2\nbuild.test 127.0.0.2\n",
        &["--phase", "build"],
    );
    let url = proxy.url();
    let code = |host: &str| {
        let target = format!("http://{host}:{port}/");
        let args = ["-o", "/dev/null", "-w", "%{http_code}", "-x", &url, &target];
        crate::proxy_support::curl(&args).1
    };
    assert_eq!((code("build.test").as_str(), code("plain.test").as_str()), ("200", "403"));
    let lines = proxy.wait_audit(|l| l.len() >= 2);
    assert!(lines.iter().all(|l| l["phase"] == "build"), "{lines:#?}");
}
