//! Action gates on the egress path (docs/gates.md), with the real `airlockd`, a real sandbox
//! and curl: an attempt to a `[gate]` host is held — no connection reaches the upstream, which
//! counts every connection it gets — until `airlock gate approve` or `deny` on the host decides
//! it, bound to the digest shown; undecided it expires; given up by the agent it is
//! abandoned; a daemon killed mid-hold leaves it `interrupted`. Every step is an audit line.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{Harness, Options};
use crate::support::{World, have, wait_until};

struct Gated {
    world: World,
    repo: std::path::PathBuf,
    harness: Harness,
    port: u16,
    hits: std::sync::Arc<AtomicUsize>,
}

/// A logged-in world whose user config allows `gated.test:PORT` (a loopback upstream that
/// answers `gated-ok`) and gates it with `timeout`.
fn gated(name: &str, ip: &str, timeout: &str) -> Gated {
    gated_with(name, ip, timeout, &[])
}

fn gated_with(name: &str, ip: &str, timeout: &str, extra_env: &[(&str, String)]) -> Gated {
    gated_config(name, ip, timeout, extra_env, "")
}

fn gated_config(
    name: &str,
    ip: &str,
    timeout: &str,
    extra_env: &[(&str, String)],
    extra_gate: &str,
) -> Gated {
    let world = World::new();
    let repo = world.repo(name);
    let (port, hits) = crate::support::http_upstream(ip, "gated-ok\n");
    let resolver = world.write(world.tmp.path().join("resolver"), &format!("gated.test {ip}\n"));
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"gated.test:{port}\"]\nallow_private = [\"{ip}/32\"]\n\
             [gate]\nhosts = [\"gated.test:{port}\"]\ntimeout = \"{timeout}\"\n{extra_gate}"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let mut env = vec![("AIRLOCK_TEST_RESOLVER".to_owned(), resolver.into())];
    for (k, v) in extra_env {
        env.push(((*k).to_owned(), v.into()));
    }
    let harness = Harness::start(&world, Options { env, ..Default::default() });
    Gated { world, repo, harness, port, hits }
}

impl Gated {
    fn airlock(&self, args: &[&str]) -> crate::support::Run {
        self.world.airlock(&self.repo).env("AIRLOCK_SOCKET", self.harness.socket()).args(args).run()
    }

    fn pending(&self) -> Vec<Value> {
        let run = self.airlock(&["gate", "list", "--json"]).expect_code(0);
        let v: Value = serde_json::from_str(&run.stdout()).unwrap();
        v["gates"].as_array().unwrap().clone()
    }

    /// The next pending gate not in `done`, waiting for it.
    fn next_gate(&self, done: &[String]) -> Value {
        let mut found = None;
        let arrived = wait_until(Duration::from_secs(60), || {
            found = self
                .pending()
                .into_iter()
                .find(|g| !done.iter().any(|d| g["id"].as_str() == Some(d.as_str())));
            found.is_some()
        });
        assert!(arrived, "no gate arrived; airlockd:\n{}", self.harness.log());
        found.unwrap()
    }

    fn exec(&self, script: &str) -> crate::support::Run {
        self.airlock(&["exec", "--", "sh", "-c", script])
    }

    fn notify_calls(&self) -> std::path::PathBuf {
        self.world.tmp.path().join("notify-calls")
    }

    /// Waits until the session's desktop notification for `gate` was sent (so deciding it
    /// cannot race the notice in a test).
    fn wait_notified(&self, gate: &Value) {
        let id = gate["id"].as_str().unwrap();
        let sent = wait_until(Duration::from_secs(30), || {
            std::fs::read_to_string(self.notify_calls()).is_ok_and(|c| c.contains(id))
        });
        assert!(sent, "no desktop notification for {id}");
    }

    /// `exec` on a desktop: `DISPLAY` set and a `notify-send` on `PATH` that records its
    /// arguments (one line per call) in the returned file.
    fn exec_on_desktop(&self, script: &str) -> (crate::support::Run, std::path::PathBuf) {
        let bin = self.world.tmp.path().join("desktop-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let calls = self.notify_calls();
        self.world.write_executable(
            bin.join("notify-send"),
            &format!(
                "#!/bin/sh\necho \"$*\" | tr '\\n' ' ' >> '{}'\necho >> '{}'\n",
                calls.display(),
                calls.display()
            ),
        );
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let run = self
            .world
            .airlock(&self.repo)
            .env("AIRLOCK_SOCKET", self.harness.socket())
            .env("DISPLAY", ":99")
            .env("PATH", path)
            .args(["exec", "--", "sh", "-c", script])
            .run();
        (run, calls)
    }
}

fn gate_lines(world: &World, repo: &str) -> (Vec<Value>, Vec<Value>) {
    world.audit_lines(repo).into_iter().partition(|l| l["method"] == "GATE")
}

fn step(steps: &[Value], gate: &str, name: &str) -> Value {
    steps
        .iter()
        .find(|l| l["gate"]["id"] == gate && l["gate"]["step"] == name)
        .unwrap_or_else(|| panic!("no {name} line for {gate}: {steps:#?}"))
        .clone()
}

#[test]
fn held_attempts_proceed_only_when_approved_and_each_approval_is_single_use() {
    if !have("curl") {
        return;
    }
    let g = gated("gated", "127.0.0.5", "60s");
    let port = g.port;
    // Three attempts, one after another: a CONNECT (curl -p), a plain-HTTP request, and a
    // second CONNECT that must be asked for again.
    let script = format!(
        "curl -sS -m 90 -p http://gated.test:{port}/first; echo \"first:$?\"\n\
         curl -sS -m 90 -D - -o /dev/null http://gated.test:{port}/second | tr -d '\\r' | \
           grep -i -e '^HTTP/' -e '^x-airlock-reason:' | sed 's/^/second:/'\n\
         curl -sS -m 90 -p http://gated.test:{port}/third; echo \"third:$?\"\n"
    );
    let decided = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec_on_desktop(&script));
        let mut done = Vec::new();

        // 1: a CONNECT, held with nothing dialed; approved.
        let first = g.next_gate(&done);
        g.wait_notified(&first);
        assert_eq!(g.hits.load(Ordering::SeqCst), 0, "dialed before the decision: {first:#}");
        assert_eq!(first["method"], "CONNECT");
        assert_eq!(first["host"], "gated.test");
        assert_eq!(first["port"], port);
        assert_eq!(first["severity"], "medium");
        assert_eq!(first["rule"], format!("gated.test:{port}"));
        assert_eq!(first["repo"], "gated");
        let digest = first["digest"].as_str().unwrap().to_owned();
        assert!(digest.starts_with("sha256:") && digest.len() == 71, "{first:#}");
        let id = first["id"].as_str().unwrap().to_owned();
        let shown = g.airlock(&["gate", "show", &id]).expect_code(0).stdout();
        assert!(shown.contains(&digest) && shown.contains("CONNECT gated.test"), "{shown}");
        let ok = g.airlock(&["gate", "approve", &id, "--note", "deploy window"]).expect_code(0);
        assert!(ok.stdout().starts_with(&format!("approved {id}")), "{}", ok.stdout());
        assert!(ok.stdout().contains("self-decision"), "{}", ok.stdout());
        // Decided once: a second decision finds nothing.
        let again = g.airlock(&["gate", "deny", &id]).expect_code(1);
        assert!(again.stderr().contains("no pending gate"), "{}", again.stderr());
        done.push(id.clone());

        // 2: a plain-HTTP request (the request line is part of the action); denied.
        let second = g.next_gate(&done);
        g.wait_notified(&second);
        assert_eq!(second["method"], "GET");
        assert_eq!(second["request"], format!("GET http://gated.test:{port}/second HTTP/1.1"));
        assert_ne!(second["digest"], first["digest"]);
        let hits_before = g.hits.load(Ordering::SeqCst);
        let id2 = second["id"].as_str().unwrap().to_owned();
        g.airlock(&["gate", "deny", &id2, "--note", "not today"]).expect_code(0);
        done.push(id2.clone());

        // 3: approving the first action again does not reach the third: it has its own id and
        // digest, and a decision naming another digest is refused and decides nothing.
        let third = g.next_gate(&done);
        g.wait_notified(&third);
        assert_ne!(third["digest"], first["digest"]);
        let id3 = third["id"].as_str().unwrap().to_owned();
        let wrong = g.airlock(&["gate", "approve", &id3, "--digest", &digest]).expect_code(1);
        assert!(wrong.stderr().contains("nothing was decided"), "{}", wrong.stderr());
        assert_eq!(g.pending().len(), 1, "the third gate must still be pending");
        let d3 = third["digest"].as_str().unwrap();
        g.airlock(&["gate", "approve", &id3, "--digest", d3]).expect_code(0);
        done.push(id3.clone());

        let run = exec.join().unwrap();
        (run, hits_before, [id, id2, id3])
    });
    let ((run, calls), hits_before_deny, [id1, id2, id3]) = decided;
    // The person at the host was told about each gate of the session, on stderr and on the
    // desktop, with the command that decides it.
    let err = run.stderr();
    for id in [&id1, &id2, &id3] {
        assert!(err.contains(&format!("gate {id}: the agent's ")), "{err}");
        assert!(err.contains(&format!("`airlock gate approve {id}`")), "{err}");
    }
    let calls = std::fs::read_to_string(calls).unwrap_or_default();
    assert_eq!(calls.lines().count(), 3, "{calls}");
    assert!(calls.contains(&format!("airlock gate approve {id1}")), "{calls}");
    let out = run.expect_code(0).stdout();
    assert!(out.contains("gated-ok\nfirst:0\n"), "{out}");
    assert!(out.contains("second:HTTP/1.1 403"), "{out}");
    assert!(out.to_ascii_lowercase().contains("second:x-airlock-reason: gate_denied"), "{out}");
    assert!(out.contains("gated-ok\nthird:0\n"), "{out}");
    assert_eq!(hits_before_deny, 1, "only the approved CONNECT was dialed before the denial");
    assert_eq!(g.hits.load(Ordering::SeqCst), 2, "the denied request was dialed");

    let (steps, attempts) = gate_lines(&g.world, "gated");
    let requested = step(&steps, &id1, "requested");
    assert_eq!(requested["gate"]["method"], "CONNECT");
    assert_eq!(requested["allowed"], false);
    assert!(requested["gate"]["deadline"].is_string(), "{requested:#}");
    let approved = step(&steps, &id1, "approved");
    assert_eq!(approved["gate"]["by"], "dev@example.test");
    assert_eq!(approved["gate"]["note"], "deploy window");
    assert_eq!(approved["gate"]["self"], true);
    assert_eq!(approved["gate"]["digest"], requested["gate"]["digest"]);
    let denied = step(&steps, &id2, "denied");
    assert_eq!(denied["gate"]["note"], "not today");
    step(&steps, &id3, "approved");
    // Each attempt's own final line carries its gate's last step.
    let final_of = |id: &str| {
        attempts.iter().find(|l| l["gate"]["id"] == id).unwrap_or_else(|| panic!("{attempts:#?}"))
    };
    let f1 = final_of(&id1);
    assert_eq!(
        (f1["allowed"].clone(), f1["reason"].clone()),
        (Value::Bool(true), "allowed".into())
    );
    assert!(f1["bytes_recv"].as_u64().unwrap() > 0, "{f1:#}");
    assert_eq!(
        f1["id"].as_str().map(|s| format!("{s}-gate-approved")),
        approved["id"].as_str().map(str::to_owned)
    );
    let f2 = final_of(&id2);
    assert_eq!(f2["allowed"], false);
    assert_eq!(f2["reason"], "gate_denied");
    assert_eq!(f2["rule"], format!("gated.test:{port}"));
    assert!(f2.get("addr").is_none(), "the denied request was dialed: {f2:#}");
    assert_eq!(final_of(&id3)["allowed"], true);

    // `airlock logs` shows the steps as gate steps, never as denials.
    let logs = g.airlock(&["logs"]).expect_code(0).stdout();
    let row = logs.lines().find(|l| l.contains(&format!("approved {id1}"))).unwrap_or_default();
    assert!(row.contains(" GATE ") && row.contains("by dev@example.test: deploy window"), "{logs}");
    let denied = g.airlock(&["logs", "--denied"]).expect_code(0).stdout();
    assert!(!denied.contains(" GATE "), "{denied}");
    assert!(denied.contains("gate_denied"), "{denied}");
}

#[test]
fn an_undecided_gate_expires_and_one_the_agent_gives_up_is_abandoned() {
    if !have("curl") {
        return;
    }
    let g = gated("expiring", "127.0.0.6", "3s");
    let port = g.port;
    // curl gives up after 1 s (the agent went away); the next attempt waits out the timeout.
    let script = format!(
        "curl -sS -m 1 -p http://gated.test:{port}/gone 2>/dev/null; echo \"gone:$?\"\n\
         curl -sS -m 1 http://gated.test:{port}/gone-http 2>/dev/null; echo \"gone-http:$?\"\n\
         curl -sS -m 30 -D - -o /dev/null http://gated.test:{port}/late | tr -d '\\r' | \
           grep -i -e '^HTTP/' -e '^x-airlock-reason:' | sed 's/^/late:/'\n\
         curl -sS -m 30 -p -o /dev/null -w 'connect:%{{http_connect}}\\n' \
           http://gated.test:{port}/late-connect 2>/dev/null\n\
         exit 0\n"
    );
    let run = g.exec(&script);
    let out = run.expect_code(0).stdout();
    assert!(out.contains("gone:28\n"), "curl timed out: {out}");
    assert!(out.contains("gone-http:28\n"), "curl timed out: {out}");
    assert!(out.contains("late:HTTP/1.1 403"), "{out}");
    assert!(out.to_ascii_lowercase().contains("late:x-airlock-reason: gate_expired"), "{out}");
    assert!(out.contains("connect:403\n"), "{out}");
    assert_eq!(g.hits.load(Ordering::SeqCst), 0, "an undecided attempt was dialed");
    assert!(g.pending().is_empty(), "gates outlived their attempts");

    let (steps, attempts) = gate_lines(&g.world, "expiring");
    let names: Vec<_> = steps.iter().map(|l| l["gate"]["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "requested",
            "abandoned",
            "requested",
            "abandoned",
            "requested",
            "expired",
            "requested",
            "expired"
        ],
        "{steps:#?}"
    );
    let reasons: Vec<_> = attempts.iter().map(|l| l["reason"].as_str().unwrap()).collect();
    assert_eq!(
        reasons,
        ["gate_abandoned", "gate_abandoned", "gate_expired", "gate_expired"],
        "{attempts:#?}"
    );
}

#[test]
fn a_daemon_killed_mid_hold_leaves_the_attempt_interrupted_and_never_dialed() {
    if !have("curl") {
        return;
    }
    let g = gated("killed", "127.0.0.7", "60s");
    let port = g.port;
    let script =
        format!("curl -sS -m 60 -p http://gated.test:{port}/x 2>/dev/null; echo \"held:$?\"\n");
    let run = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        let gate = g.next_gate(&[]);
        g.harness.signal(nix::sys::signal::Signal::SIGKILL);
        let run = exec.join().unwrap();
        (run, gate)
    });
    let (run, gate) = run;
    let out = run.stdout();
    assert!(!out.contains("held:0"), "the held attempt went through: {out}");
    assert_eq!(g.hits.load(Ordering::SeqCst), 0, "the held attempt was dialed");
    // The next instance settles what the killed one had open.
    g.airlock(&["status"]).expect_code(0);
    let settled = wait_until(Duration::from_secs(20), || {
        g.world.audit_lines("killed").iter().any(|l| l["reason"] == "interrupted")
    });
    let (steps, attempts) = gate_lines(&g.world, "killed");
    assert!(settled, "{attempts:#?}");
    let id = gate["id"].as_str().unwrap();
    step(&steps, id, "requested");
    assert!(!steps.iter().any(|l| l["gate"]["step"] == "approved"), "{steps:#?}");
    assert!(g.pending().is_empty());
}

/// A tool that ignores the proxy variables is captured transparently (docs/proxy.md) and held
/// like a CONNECT: its target is the name behind the synthetic address the sandbox's resolver
/// gave out.
#[test]
fn a_captured_connection_to_a_gated_host_is_held_too() {
    if !have("curl") {
        return;
    }
    let synthetic = std::env::temp_dir().join(format!("airlock-gate-synth-{}", std::process::id()));
    std::fs::write(&synthetic, "198.18.0.7 gated.test\n").unwrap();
    let g = gated_with(
        "captured",
        "127.0.0.8",
        "60s",
        &[("AIRLOCK_TEST_SYNTHETIC", synthetic.display().to_string())],
    );
    let port = g.port;
    let script =
        format!("curl --noproxy '*' -sS -m 60 http://198.18.0.7:{port}/cap; echo \"cap:$?\"\n");
    let (run, id) = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        let gate = g.next_gate(&[]);
        assert_eq!(g.hits.load(Ordering::SeqCst), 0, "dialed before the decision: {gate:#}");
        assert_eq!(
            (gate["host"].as_str(), gate["method"].as_str()),
            (Some("gated.test"), Some("CONNECT"))
        );
        let id = gate["id"].as_str().unwrap().to_owned();
        g.airlock(&["gate", "approve", &id]).expect_code(0);
        (exec.join().unwrap(), id)
    });
    let _ = std::fs::remove_file(&synthetic);
    let out = run.expect_code(0).stdout();
    assert!(out.contains("gated-ok\ncap:0\n"), "{out}");
    let (steps, attempts) = gate_lines(&g.world, "captured");
    step(&steps, &id, "approved");
    let last = attempts.iter().find(|l| l["gate"]["id"] == id.as_str()).unwrap();
    assert_eq!(last["capture"], "transparent");
    assert_eq!(last["allowed"], true);
}

/// A real Claude Code `PreToolUse` payload for a Bash call (the fields Claude Code sends).
const PUSH_PAYLOAD: &str = r#"{"session_id":"9f3c2a1e-5b7d-4c8e-a1f2-3d4e5f6a7b8c","transcript_path":"/home/agent/.claude/projects/-toolgate/9f3c2a1e-5b7d-4c8e-a1f2-3d4e5f6a7b8c.jsonl","cwd":"/toolgate","permission_mode":"default","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"cd /toolgate && git push origin main","description":"Push the branch to origin"}}"#;
const LS_PAYLOAD: &str = r#"{"session_id":"9f3c2a1e-5b7d-4c8e-a1f2-3d4e5f6a7b8c","transcript_path":"/home/agent/.claude/projects/-toolgate/9f3c2a1e-5b7d-4c8e-a1f2-3d4e5f6a7b8c.jsonl","cwd":"/toolgate","permission_mode":"default","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls -la","description":"List files"}}"#;

/// `[gate] commands` (advisory tool-call gates): the sandbox's read-only `/etc` carries Claude
/// Code's managed settings and the hook; fed a real `PreToolUse` payload the hook lets a
/// command that matches no pattern run at once, and one that matches only once a person
/// approved it; a denial, an expiry and a malformed payload all exit 2 (the only status that
/// stops Claude Code's tool call). What the agent can set — `~/.curlrc`, the proxy variables,
/// a `curl` earlier on `PATH` — does not steer the hook away from the real gate (the denied
/// call is made with all three in place and still reaches the person who denies it).
#[test]
fn the_claude_code_hook_asks_before_a_gated_command_and_fails_closed() {
    if !have("curl") {
        return;
    }
    let g = gated_config("toolgate", "127.0.0.9", "8s", &[], "commands = [\"git push*\"]\n");
    g.world.write(g.repo.join("push.json"), PUSH_PAYLOAD);
    g.world.write(g.repo.join("ls.json"), LS_PAYLOAD);
    let script = "H=/etc/claude-code/airlock-gate-hook\n\
         tr -d ' \\n' < /etc/claude-code/managed-settings.json; echo\n\
         (echo '{}' > /etc/claude-code/managed-settings.json) 2>/dev/null; echo \"write:$?\"\n\
         $H 23 http://127.0.0.1:8888 < ls.json; echo \"ls:$?\"\n\
         $H 23 http://127.0.0.1:8888 < push.json 2>/dev/null; echo \"approved:$?\"\n\
         printf 'proxy = \"http://127.0.0.1:9\"\\n' > ~/.curlrc; mkdir -p /tmp/shim\n\
         printf '#!/bin/sh\\necho 200\\n' > /tmp/shim/curl; chmod +x /tmp/shim/curl\n\
         (export http_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 PATH=/tmp/shim:$PATH\n\
          $H 23 http://127.0.0.1:8888 < push.json 2>/tmp/denied; echo \"denied:$?\")\n\
         sed 's/^/denied-why:/' /tmp/denied\n\
         $H 23 http://127.0.0.1:8888 < push.json 2>/dev/null; echo \"expired:$?\"\n\
         echo 'not json' | $H 23 http://127.0.0.1:8888 2>/dev/null; echo \"malformed:$?\"\n";
    let run = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(script));
        let mut done = Vec::new();
        let first = g.next_gate(&done);
        assert_eq!(first["kind"], "tool");
        assert_eq!(first["method"], "Bash");
        assert_eq!(first["request"], "cd /toolgate && git push origin main");
        assert_eq!(first["rule"], "git push*");
        let action: Value = serde_json::from_str(first["action"].as_str().unwrap()).unwrap();
        assert_eq!(action["action"], "cd /toolgate && git push origin main");
        let id = first["id"].as_str().unwrap().to_owned();
        g.airlock(&["gate", "approve", &id]).expect_code(0);
        done.push(id);
        let second = g.next_gate(&done);
        assert_ne!(second["digest"], first["digest"], "each ask is its own action");
        let id2 = second["id"].as_str().unwrap().to_owned();
        g.airlock(&["gate", "deny", &id2, "--note", "no pushes today"]).expect_code(0);
        // The third is left to expire.
        exec.join().unwrap()
    });
    let out = run.expect_code(0).stdout();
    assert!(
        out.contains(r#"{"hooks":[{"command":"/etc/claude-code/airlock-gate-hook23http://127.0.0.1:8888","timeout":38,"type":"command"}],"matcher":"Bash"}"#),
        "{out}"
    );
    assert!(
        out.contains("write:1\n") || out.contains("write:2\n"),
        "the managed settings are writable: {out}"
    );
    assert!(out.contains("ls:0\n"), "{out}");
    assert!(out.contains("approved:0\n"), "{out}");
    assert!(out.contains("denied:2\n"), "{out}");
    assert!(
        out.contains("denied-why:airlock gate: the gate answered 403")
            && out.contains("no pushes today"),
        "{out}"
    );
    assert!(out.contains("expired:2\n"), "{out}");
    assert!(out.contains("malformed:2\n"), "{out}");
    let (steps, attempts) = gate_lines(&g.world, "toolgate");
    let names: Vec<_> = steps.iter().map(|l| l["gate"]["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["requested", "approved", "requested", "denied", "requested", "expired"],
        "{steps:#?}"
    );
    assert!(steps.iter().all(|l| l["host"] == "gate.airlock"), "{steps:#?}");
    let reasons: Vec<_> = attempts
        .iter()
        .filter(|l| l["host"] == "gate.airlock")
        .map(|l| l["reason"].as_str().unwrap())
        .collect();
    // `ls` asked nothing and left no line; the malformed payload did.
    assert_eq!(reasons, ["allowed", "gate_denied", "gate_expired", "malformed"], "{attempts:#?}");
}

/// Across sessions (docs/security.md, "Action gates"): an agent cannot lift the gates of the
/// next session. Session 1 tries the ways it has — rewrite the trusted `.airlock.toml`
/// without its `[gate]`, plant a project `.claude/settings.json` that turns hooks off,
/// overwrite the managed settings — and session 2, then the host's own `airlock policy
/// check`, find the gate in force and the repo file as it was trusted.
#[test]
fn what_a_session_plants_never_lifts_the_next_sessions_gates() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let repo = world.repo("plant-gate");
    let (port, hits) = crate::support::http_upstream("127.0.0.10", "gated-ok\n");
    let resolver = world.write(world.tmp.path().join("resolver"), "gated.test 127.0.0.10\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"gated.test:{port}\"]\nallow_private = [\"127.0.0.10/32\"]\n"
        ),
    );
    let repo_file = format!(
        "[gate]\nhosts = [\"gated.test:{port}\"]\ntimeout = \"2s\"\ncommands = [\"git push*\"]\n"
    );
    world.write(repo.join(".airlock.toml"), &repo_file);
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let exec = |script: &str| {
        world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec", "--", "sh", "-c", script])
            .run()
    };
    // Session 1 plants.
    let plant = "printf '[network]\\nallow = [\"gated.test:*\"]\\n' > .airlock.toml 2>/dev/null; echo \"toml:$?\"\n\
         mkdir -p .claude 2>/dev/null; printf '{\"disableAllHooks\": true}' > .claude/settings.json 2>/dev/null; echo \"claude:$?\"\n\
         printf '{}' > /etc/claude-code/managed-settings.json 2>/dev/null; echo \"managed:$?\"\n";
    let out = exec(plant).expect_code(0).stdout();
    for what in ["toml", "claude", "managed"] {
        assert!(!out.contains(&format!("{what}:0\n")), "{what} was writable: {out}");
    }
    assert_eq!(std::fs::read_to_string(repo.join(".airlock.toml")).unwrap(), repo_file);
    let planted = std::fs::read_to_string(repo.join(".claude/settings.json")).unwrap_or_default();
    assert!(!planted.contains("disableAllHooks"), "{planted}");

    // Session 2: the gate holds (nobody decides, so it expires) and the hook is installed.
    let second = format!(
        "curl -sS -m 30 -D - -o /dev/null http://gated.test:{port}/ | tr -d '\\r' | grep -i '^x-airlock-reason:'\n\
         grep -c airlock-gate-hook /etc/claude-code/managed-settings.json\n"
    );
    let out = exec(&second).expect_code(0).stdout();
    assert!(out.to_ascii_lowercase().contains("x-airlock-reason: gate_expired"), "{out}");
    assert!(out.ends_with("1\n"), "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the gated host was reached");

    // The host's own view is the trusted file's.
    let check = world
        .airlock(&repo)
        .args(["policy", "check", "--json", &format!("gated.test:{port}")])
        .run();
    let v: Value = serde_json::from_str(check.stdout().trim()).unwrap();
    assert_eq!(v["gate"]["rule"], format!("gated.test:{port}"), "{v}");
}
