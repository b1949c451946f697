//! Action gates decided on a review server (docs/gates.md "With a review server"), end to end
//! with the real binaries: a developer logged in to a real `airlockd review` (embedded store,
//! on loopback) runs curl in a real sandbox against a gated upstream that counts every
//! connection; the supervisor relays each held attempt to the server, and a *reviewer* —
//! another person, logged in from another home — decides it with `airlock gate`. Nothing is
//! dialed before the decision; the developer cannot decide their own agent's attempt, neither
//! through the server nor through their airlockd; a `high` gate needs the reviewer's password;
//! a server that cannot be reached fails closed; a daemon killed mid-hold withdraws the gate.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::console_auth::set_password;
use crate::harness::{Harness, Options};
use crate::review_support::{Server, StoreSel, get, user_with_token};
use crate::support::{World, airlock_stdin, have, wait_until};

pub(crate) const PW: &str = "reviewer password 42";

pub(crate) struct Relayed {
    pub(crate) dev: World,
    /// The reviewer's own home (`airlock login --server` with the reviewer's token).
    rev: World,
    repo: std::path::PathBuf,
    harness: Harness,
    pub(crate) server: Server,
    /// The reviewer's token, for reading the server's record.
    pub(crate) rev_token: String,
    pub(crate) port: u16,
    pub(crate) hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A developer world whose user config allows and gates `gated.test:PORT` (`extra` adds to
/// `[gate]`), logged in to a fresh review server with a reviewer (with a console password)
/// and an admin besides the developer.
pub(crate) fn relayed(name: &str, ip: &str, timeout: &str, extra: &str) -> Relayed {
    let dev = World::new();
    let rev = World::new();
    let repo = dev.repo(name);
    let (port, hits) = crate::support::http_upstream(ip, "gated-ok\n");
    let resolver = dev.write(dev.tmp.path().join("resolver"), &format!("gated.test {ip}\n"));
    dev.write(
        dev.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"gated.test:{port}\"]\nallow_private = [\"{ip}/32\"]\n\
             [gate]\nhosts = [\"gated.test:{port}\"]\ntimeout = \"{timeout}\"\n{extra}"
        ),
    );
    let store = StoreSel::Embedded(dev.tmp.path().join("store"));
    user_with_token(&dev, &store, "admin@example.test", "admin");
    let dev_token = user_with_token(&dev, &store, "dev@example.test", "member");
    let rev_token = user_with_token(&dev, &store, "rev@example.test", "reviewer");
    set_password(&dev, &store, "rev@example.test", &format!("{PW}\n")).expect_code(0);
    let server = Server::start(&dev, &store, &[]);
    for (world, token) in [(&dev, &dev_token), (&rev, &rev_token)] {
        airlock_stdin(
            world,
            world.tmp.path(),
            &["login", "--server", &server.base, "--token-stdin"],
            &format!("{token}\n"),
        )
        .expect_code(0);
    }
    let env = vec![("AIRLOCK_TEST_RESOLVER".to_owned(), resolver.into())];
    let harness = Harness::start(&dev, Options { env, ..Default::default() });
    Relayed { dev, rev, repo, harness, server, rev_token, port, hits }
}

impl Relayed {
    fn dev(&self, args: &[&str]) -> crate::support::Run {
        self.dev.airlock(&self.repo).env("AIRLOCK_SOCKET", self.harness.socket()).args(args).run()
    }

    fn rev(&self, args: &[&str]) -> crate::support::Run {
        self.rev.airlock(self.rev.tmp.path()).args(args).run()
    }

    fn rev_stdin(&self, args: &[&str], stdin: &str) -> crate::support::Run {
        airlock_stdin(&self.rev, self.rev.tmp.path(), args, stdin)
    }

    /// The next pending server gate not in `done`, as the reviewer lists it.
    pub(crate) fn next_gate(&self, done: &[String]) -> Value {
        let mut found = None;
        let arrived = wait_until(Duration::from_secs(60), || {
            let run = self.rev(&["gate", "list", "--json"]);
            let v: Value = serde_json::from_str(&run.stdout()).unwrap_or_default();
            found = v["gates"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| !done.iter().any(|d| g["id"].as_str() == Some(d.as_str())))
                .cloned();
            found.is_some()
        });
        assert!(arrived, "no gate reached the server; airlockd:\n{}", self.harness.log());
        found.unwrap()
    }

    pub(crate) fn server_gate(&self, id: &str) -> Value {
        let r = get(&self.server.base, &self.rev_token, &format!("/api/v1/gates/{id}"), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    pub(crate) fn exec(&self, script: &str) -> crate::support::Run {
        self.dev(&["exec", "--", "sh", "-c", script])
    }
}

fn steps(world: &World, repo: &str) -> (Vec<Value>, Vec<Value>) {
    world.audit_lines(repo).into_iter().partition(|l| l["method"] == "GATE")
}

#[test]
fn a_reviewer_decides_the_developers_held_attempts_on_the_review_server() {
    if !have("curl") {
        return;
    }
    let g = relayed("relayed", "127.0.0.11", "60s", "");
    let port = g.port;
    let script = format!(
        "curl -sS -m 90 -p http://gated.test:{port}/first; echo \"first:$?\"\n\
         curl -sS -m 90 -D - -o /dev/null http://gated.test:{port}/second | tr -d '\\r' | \
           grep -i -e '^HTTP/' -e '^x-airlock-reason:' | sed 's/^/second:/'\n\
         curl -sS -m 90 -X POST http://gate.airlock/v1/gates -H 'Content-Type: application/json' \
           -d '{{\"action\":\"terraform apply -auto-approve\",\"tool\":\"Bash\"}}' \
           | tr -d '\\n' | sed 's/^/tool:/'; echo\n"
    );
    let (run, first, second) = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        // 1: held, relayed, visible to the reviewer with the daemon's canonical action.
        let first = g.next_gate(&[]);
        assert_eq!(g.hits.load(Ordering::SeqCst), 0, "dialed before the decision: {first:#}");
        assert_eq!(
            (first["kind"].as_str(), first["method"].as_str()),
            (Some("egress"), Some("CONNECT"))
        );
        assert_eq!(first["host"], "gated.test");
        assert_eq!(first["user_email"], "dev@example.test");
        assert_eq!(first["rule"], format!("gated.test:{port}"));
        let id = first["id"].as_str().unwrap().to_owned();
        let local = first["local_id"].as_str().unwrap().to_owned();
        // The developer decides nothing of their own agent's: not on the server (a member,
        // the requester)…
        let own = g.dev(&["gate", "approve", &id]).expect_code(1);
        assert!(own.stderr().contains("403"), "{}", own.stderr());
        // …and not through their own airlockd, which takes only the relay's decisions.
        let listed = g.dev(&["gate", "--local", "list", "--json"]).expect_code(0).stdout();
        assert!(listed.contains(&g.server.base), "the local gate names its server: {listed}");
        let local_try = g.dev(&["gate", "--local", "approve", &local]).expect_code(1);
        assert!(
            local_try.stderr().contains("decided on the review server"),
            "{}",
            local_try.stderr()
        );
        assert_eq!(g.hits.load(Ordering::SeqCst), 0, "a refused decision let it through");
        // The reviewer reads it and approves.
        let shown = g.rev(&["gate", "show", &id]).expect_code(0).stdout();
        assert!(
            shown.contains("asked by: dev@example.test") && shown.contains("CONNECT gated.test"),
            "{shown}"
        );
        let ok = g.rev(&["gate", "approve", &id, "--note", "release window"]).expect_code(0);
        assert!(ok.stdout().starts_with(&format!("approved {id}")), "{}", ok.stdout());
        assert!(!ok.stdout().contains("self-decision"), "{}", ok.stdout());

        // 2: a plain-HTTP request; denied by the reviewer.
        let second = g.next_gate(std::slice::from_ref(&id));
        let id2 = second["id"].as_str().unwrap().to_owned();
        assert_eq!(second["request"], format!("GET http://gated.test:{port}/second HTTP/1.1"));
        let hits = g.hits.load(Ordering::SeqCst);
        g.rev(&["gate", "deny", &id2, "--note", "not in prod"]).expect_code(0);
        let again = g.rev(&["gate", "approve", &id2]).expect_code(1);
        assert!(again.stderr().contains("denied already"), "{}", again.stderr());

        // 3: an agent's own tool call asked through gate.airlock, relayed the same way.
        let third = g.next_gate(&[id.clone(), id2.clone()]);
        assert_eq!(
            (third["kind"].as_str(), third["method"].as_str()),
            (Some("tool"), Some("Bash"))
        );
        assert_eq!(third["request"], "terraform apply -auto-approve");
        g.rev(&["gate", "approve", third["id"].as_str().unwrap()]).expect_code(0);
        (exec.join().unwrap(), first, (second, hits))
    });
    let (second, hits_before_deny) = second;
    let err = run.stderr();
    let out = run.expect_code(0).stdout();
    assert!(out.contains("gated-ok\nfirst:0\n"), "{out}");
    assert!(out.contains("second:HTTP/1.1 403"), "{out}");
    assert!(out.to_ascii_lowercase().contains("second:x-airlock-reason: gate_denied"), "{out}");
    let tool: Value =
        serde_json::from_str(out.lines().find_map(|l| l.strip_prefix("tool:")).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (tool["state"].as_str(), tool["by"].as_str()),
        (Some("approved"), Some("rev@example.test")),
        "{out}"
    );
    assert!(tool["server"].as_str().is_some_and(|s| s.starts_with("gt_")), "{out}");
    assert_eq!(
        (hits_before_deny, g.hits.load(Ordering::SeqCst)),
        (1, 1),
        "only the approved attempt was dialed"
    );
    // The developer was told where their gate waits.
    let id = first["id"].as_str().unwrap();
    assert!(
        err.contains(&format!(
            "gate {id}: the agent's CONNECT gated.test:{port} waits for a reviewer"
        )),
        "{err}"
    );

    // The audit lines name the reviewer and the server's gate; the server's own record too.
    let (steps, attempts) = steps(&g.dev, "relayed");
    let approved = steps.iter().find(|l| l["gate"]["step"] == "approved").unwrap();
    assert_eq!(approved["gate"]["by"], "rev@example.test");
    assert_eq!(approved["gate"]["self"], false);
    assert_eq!(approved["gate"]["server"], id);
    assert_eq!(approved["gate"]["note"], "release window");
    assert_eq!(approved["gate"]["digest"], first["digest"]);
    let denied = steps.iter().find(|l| l["gate"]["step"] == "denied").unwrap();
    assert_eq!(denied["gate"]["server"], second["id"]);
    assert!(attempts.iter().any(|l| l["reason"] == "gate_denied"), "{attempts:#?}");
    let sg = g.server_gate(id);
    assert_eq!(
        (sg["state"].as_str(), sg["decision"]["by_email"].as_str()),
        (Some("approved"), Some("rev@example.test"))
    );
    assert_eq!(sg["local_id"], approved["gate"]["id"]);
    let events = crate::review_support::all_events(
        &g.server.base,
        &g.rev_token,
        "&source=gate&user=dev@example.test",
    );
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "gate.requested",
            "gate.approved",
            "gate.requested",
            "gate.denied",
            "gate.requested",
            "gate.approved"
        ],
        "{events:#?}"
    );
}

#[test]
fn a_high_gate_needs_the_reviewers_password_again() {
    if !have("curl") {
        return;
    }
    let g = relayed(
        "stepup",
        "127.0.0.12",
        "60s",
        "[[gate.rule]]\nhost = \"gated.test\"\nseverity = \"high\"\n",
    );
    let port = g.port;
    let script = format!("curl -sS -m 90 -p http://gated.test:{port}/pay; echo \"pay:$?\"\n");
    let run = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        let gate = g.next_gate(&[]);
        assert_eq!(gate["severity"], "high");
        let id = gate["id"].as_str().unwrap();
        let token_only = g.rev(&["gate", "approve", id]).expect_code(1);
        assert!(token_only.stderr().contains("--password-stdin"), "{}", token_only.stderr());
        let wrong =
            g.rev_stdin(&["gate", "approve", id, "--password-stdin"], "not it\n").expect_code(1);
        assert!(wrong.stderr().contains("password is wrong"), "{}", wrong.stderr());
        assert_eq!(g.hits.load(Ordering::SeqCst), 0);
        g.rev_stdin(
            &["gate", "approve", id, "--password-stdin", "--note", "refund 4411"],
            &format!("{PW}\n"),
        )
        .expect_code(0);
        let sg = g.server_gate(id);
        assert_eq!(sg["decision"]["step_up"], true);
        exec.join().unwrap()
    });
    let out = run.expect_code(0).stdout();
    assert!(out.contains("gated-ok\npay:0\n"), "{out}");
}

#[test]
fn an_unreachable_server_fails_closed_and_a_killed_daemon_withdraws_its_gate() {
    if !have("curl") {
        return;
    }
    let mut g = relayed("closed", "127.0.0.13", "60s", "");
    let port = g.port;

    // A daemon killed mid-hold: the attempt is never dialed, and the server's gate is
    // withdrawn (`abandoned`) once the supervisor sees the hold gone.
    let script =
        format!("curl -sS -m 60 -p http://gated.test:{port}/x 2>/dev/null; echo \"held:$?\"\n");
    let (run, gate) = std::thread::scope(|s| {
        let exec = s.spawn(|| g.exec(&script));
        let gate = g.next_gate(&[]);
        g.harness.signal(nix::sys::signal::Signal::SIGKILL);
        (exec.join().unwrap(), gate)
    });
    assert!(!run.stdout().contains("held:0"), "{}", run.stdout());
    assert_eq!(g.hits.load(Ordering::SeqCst), 0, "the held attempt was dialed");
    let id = gate["id"].as_str().unwrap();
    let withdrawn =
        wait_until(Duration::from_secs(30), || g.server_gate(id)["state"] == "abandoned");
    assert!(withdrawn, "{:#}", g.server_gate(id));

    // The server goes away: the next gated attempt is refused at once, saying why.
    let _ = g.server.child.kill();
    let _ = g.server.child.wait();
    let run = g.exec(&format!(
        "curl -sS -m 60 -D - -o /dev/null http://gated.test:{port}/y | tr -d '\\r' | \
           grep -i -e '^HTTP/' -e '^x-airlock-reason:'\n"
    ));
    let out = run.expect_code(0).stdout().to_ascii_lowercase();
    assert!(
        out.contains("http/1.1 503") && out.contains("x-airlock-reason: gate_unavailable"),
        "{out}"
    );
    assert_eq!(g.hits.load(Ordering::SeqCst), 0);
    let (steps, _) = steps(&g.dev, "closed");
    let last = steps.last().unwrap();
    assert_eq!(last["gate"]["step"], "abandoned", "{steps:#?}");
    let note = last["gate"]["note"].as_str().unwrap_or_default();
    assert!(note.contains(&g.server.base) && note.contains("could not take the gate"), "{note}");
}
