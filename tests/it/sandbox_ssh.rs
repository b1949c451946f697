//! OpenSSH and git over ssh from inside `airlock exec`, through transparent capture (issue 14):
//! the real `ssh` client (no ProxyCommand, no proxy variables) against a private `sshd` the
//! test starts on the host side on `127.0.0.x` ([`crate::sshd`]). Inside, `allowed.test`
//! resolves through the sandbox's resolver to a synthetic address; the capture maps it back,
//! the policy entry `allowed.test:PORT` (naming the port: SSH speaks first from the server, so
//! there is no TLS ClientHello to check) allows it, and the test resolver maps the name to the
//! sshd's address, dialed through the address guard (`allow_private` names it).
//!
//! As root the allowed port is 22 (`ssh -p 22 git@allowed.test`, an entry naming port 22); as
//! the unprivileged CI user (`.ci/unprivileged`) a high port, with the entry naming it. The
//! sshd listens on a second port the policy does not name, so a refusal that leaked would show
//! up in its log. Nothing here dials outside loopback: the sandbox's netns has only `lo`, and
//! every name resolves (test resolver) to the sshd's 127.0.0.x.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::{Harness, Options};
use crate::sshd::{Sshd, have_openssh};
use crate::support::{World, have, wait_until};

/// A synthetic-looking address the `AIRLOCK_TEST_SYNTHETIC` hook maps to `refused.test` (far
/// from the session's own assignments, which start at 198.18.0.1): connecting to it reaches
/// the capture as the name `refused.test`, which the policy does not allow.
const REFUSED_SYNTHETIC: &str = "198.19.200.9";

struct Setup {
    world: World,
    repo: PathBuf,
    sshd: Sshd,
    harness: Harness,
    /// The client key's path inside the sandbox (the repo is mounted at the working directory).
    key_inside: String,
}

impl Setup {
    /// A World whose policy allows `allowed.test` on the sshd's first port only, a running
    /// sshd, and an `airlockd` (activation harness) with the test resolver and synthetic hook.
    fn new(repo_name: &str) -> Option<Self> {
        if !have_openssh() || !have("git") {
            return None;
        }
        let world = World::new();
        let repo = world.repo(repo_name);
        // The client key lives in the repo: the sandbox mounts it read-write (the user's own
        // `~/.ssh` is not visible inside, docs/sandbox.md).
        let sshd = Sshd::start(&repo.join("ssh-test-key"));
        let ip = sshd.ip;
        let resolver = world.write(
            world.tmp.path().join("resolver"),
            &format!("allowed.test {ip}\nrefused.test {ip}\n"),
        );
        let synthetic = world.write(
            world.tmp.path().join("synthetic"),
            &format!("{REFUSED_SYNTHETIC} refused.test\n"),
        );
        world.write(
            world.home.join(".airlock/config.toml"),
            &format!(
                "[network]\nallow = [\"allowed.test:{}\"]\nallow_private = [\"{ip}/32\"]\n",
                sshd.ports[0]
            ),
        );
        world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
        let harness = Harness::start(
            &world,
            Options {
                env: vec![
                    ("AIRLOCK_TEST_RESOLVER".into(), resolver.into()),
                    ("AIRLOCK_TEST_SYNTHETIC".into(), synthetic.into()),
                ],
                ..Default::default()
            },
        );
        let key_inside = "\"$PWD/ssh-test-key\"".to_owned();
        Some(Self { world, repo, sshd, harness, key_inside })
    }

    /// `sh -c SCRIPT` inside `airlock exec`: (exit code, stdout, stderr).
    fn exec(&self, script: &str) -> (i32, String, String) {
        let run = self
            .world
            .airlock(&self.repo)
            .env("AIRLOCK_SOCKET", self.harness.socket())
            .args(["exec", "--", "sh", "-c", script])
            .run();
        (run.code(), run.stdout(), run.stderr())
    }

    fn ssh(&self) -> String {
        format!("ssh {}", self.sshd.ssh_options(&self.key_inside))
    }

    /// Waits (bounded) until the repo's audit lines satisfy `pred` (a tunnel's final line is
    /// written when the relay ends, which may be just after the client exited); all lines.
    fn wait_lines(
        &self,
        repo: &str,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        wait_until(Duration::from_secs(10), || pred(&self.world.audit_lines(repo)));
        self.world.audit_lines(repo)
    }

    fn context(&self, out: &str, err: &str) -> String {
        format!(
            "--- stdout\n{out}\n--- stderr\n{err}\n--- airlockd log\n{}\n--- sshd log\n{}",
            self.harness.log(),
            self.sshd.log()
        )
    }
}

fn transparent_line<'a>(
    lines: &'a [serde_json::Value],
    host: &str,
    port: u16,
) -> Option<&'a serde_json::Value> {
    lines.iter().find(|l| l["host"] == host && l["port"] == port && l["capture"] == "transparent")
}

#[test]
fn ssh_to_an_allowed_name_and_port_works_through_capture_and_is_audited() {
    let Some(s) = Setup::new("ssh-allowed") else { return };
    let port = s.sshd.ports[0];
    let script = format!(
        "set -u\n\
         {ssh} -p {port} {user}@allowed.test echo via-ssh\n\
         echo \"ssh-exit:$?\"\n\
         ssh -i {key} -o BatchMode=yes -o StrictHostKeyChecking=accept-new -p {port} \
             {user}@allowed.test echo first-contact 2>&1\n\
         ssh -i {key} -o BatchMode=yes -p {port} {user}@allowed.test echo known-host\n\
         echo \"known-hosts:$(wc -l < \"$HOME/.ssh/known_hosts\")\"\n",
        ssh = s.ssh(),
        user = s.sshd.user,
        key = s.key_inside,
    );
    let (code, out, err) = s.exec(&script);
    assert_eq!(code, 0, "{}", s.context(&out, &err));
    assert!(out.contains("via-ssh\nssh-exit:0\n"), "{}", s.context(&out, &err));
    // ssh's own defaults work inside too: the passwd entry it looks up (getpwuid) is the
    // sandbox's, whose home (`/home/agent`, HOME) is writable, so the first contact stores the
    // host key in `~/.ssh/known_hosts` and the next connection checks against it.
    assert!(out.contains("first-contact\n"), "{}", s.context(&out, &err));
    assert!(out.contains("known-host\nknown-hosts:1\n"), "{}", s.context(&out, &err));
    assert_eq!(s.sshd.connections(port), 3, "{}", s.context(&out, &err));

    // One final line per connection, each allowed, dialed at the sshd, bytes both ways (the
    // version strings, key exchange and the command).
    let finals = |lines: &[serde_json::Value]| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| {
                l["host"] == "allowed.test" && l["port"] == port && !l["duration_ms"].is_null()
            })
            .cloned()
            .collect()
    };
    let lines = s.wait_lines("ssh-allowed", |l| finals(l).len() >= 3);
    let ssh_lines = finals(&lines);
    assert_eq!(ssh_lines.len(), 3, "{lines:?}");
    for line in &ssh_lines {
        assert_eq!(line["capture"], "transparent", "{line}");
        assert_eq!(line["allowed"], true, "{line}");
        assert_eq!(line["method"], "CONNECT", "{line}");
        assert_eq!(line["addr"], format!("{}:{port}", s.sshd.ip).as_str(), "{line}");
        assert!(line["bytes_sent"].as_u64().unwrap_or(0) > 0, "{line}");
        assert!(line["bytes_recv"].as_u64().unwrap_or(0) > 0, "{line}");
    }
    // The name was asked of the sandbox's resolver first (the synthetic address ssh dialed).
    assert!(lines.iter().any(|l| l["method"] == "DNS" && l["host"] == "allowed.test"), "{lines:?}");
}

#[test]
fn git_clone_over_ssh_works_through_capture() {
    let Some(s) = Setup::new("ssh-git") else { return };
    let port = s.sshd.ports[0];
    // A bare repo on the host side with one commit, served by the sshd's git-upload-pack.
    let srv = s.world.tmp.path().join("srv");
    let bare = srv.join("repo.git");
    let work = srv.join("work");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=Airlock Test", "-c", "user.email=test@example.test"])
            .args(["-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always"])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (bare_s, work_s) = (bare.to_str().unwrap(), work.to_str().unwrap());
    git(&["init", "-q", "--bare", bare_s]);
    git(&["init", "-q", work_s]);
    std::fs::write(work.join("README"), "cloned over ssh\n").unwrap();
    git(&["-C", work_s, "add", "README"]);
    git(&["-C", work_s, "commit", "-q", "-m", "commit-over-ssh"]);
    git(&["-C", work_s, "push", "-q", bare_s, "HEAD:refs/heads/main"]);

    let script = format!(
        "set -u\n\
         export GIT_SSH_COMMAND='{ssh}'\n\
         git clone -q ssh://{user}@allowed.test:{port}{bare_s} /tmp/clone\n\
         echo \"clone-exit:$?\"\n\
         echo \"subject:$(git -C /tmp/clone log -1 --format=%s)\"\n\
         echo \"readme:$(cat /tmp/clone/README)\"\n",
        ssh = s.ssh(),
        user = s.sshd.user,
    );
    let (code, out, err) = s.exec(&script);
    assert_eq!(code, 0, "{}", s.context(&out, &err));
    assert!(out.contains("clone-exit:0\n"), "{}", s.context(&out, &err));
    assert!(out.contains("subject:commit-over-ssh\n"), "{}", s.context(&out, &err));
    assert!(out.contains("readme:cloned over ssh\n"), "{}", s.context(&out, &err));

    let lines = s.wait_lines("ssh-git", |ls| {
        ls.iter().any(|l| {
            l["host"] == "allowed.test" && l["port"] == port && !l["duration_ms"].is_null()
        })
    });
    let line = transparent_line(&lines, "allowed.test", port).expect("transparent git line");
    assert_eq!(line["allowed"], true, "{lines:?}");
}

#[test]
fn ssh_to_a_port_or_name_the_policy_does_not_allow_is_refused_audited_and_never_reaches_sshd() {
    let Some(s) = Setup::new("ssh-refused") else { return };
    let [allowed_port, other_port] = s.sshd.ports;
    let ssh = s.ssh();
    let user = &s.sshd.user;
    let script = format!(
        "{ssh} -p {other_port} {user}@allowed.test echo REACHED-port\n\
         echo \"port-refused:$?\"\n\
         {ssh} -p {allowed_port} {user}@{REFUSED_SYNTHETIC} echo REACHED-synthetic\n\
         echo \"synthetic-refused:$?\"\n\
         {ssh} -p {allowed_port} {user}@refused.test echo REACHED-name\n\
         echo \"name-refused:$?\"\n"
    );
    let (code, out, err) = s.exec(&script);
    assert_eq!(code, 0, "{}", s.context(&out, &err));
    assert!(!out.contains("REACHED"), "{}", s.context(&out, &err));
    // ssh exits 255 on a connection or resolution failure (ssh(1)).
    for what in ["port-refused", "synthetic-refused", "name-refused"] {
        assert!(out.contains(&format!("{what}:255\n")), "{what}: {}", s.context(&out, &err));
    }
    // Nothing reached the server, on either port.
    assert_eq!(s.sshd.connections(allowed_port), 0, "{}", s.context(&out, &err));
    assert_eq!(s.sshd.connections(other_port), 0, "{}", s.context(&out, &err));

    let lines = s.wait_lines("ssh-refused", |ls| {
        ls.iter().any(|l| l["host"] == "refused.test" && l["method"] == "DNS")
    });
    // The port the entry does not name: allowed name, refused by the capture.
    let port = transparent_line(&lines, "allowed.test", other_port).expect("port refusal line");
    assert_eq!(port["allowed"], false, "{lines:?}");
    assert_eq!(port["reason"], "not_allowed", "{lines:?}");
    assert!(port["addr"].is_null(), "never dialed: {port}");
    // A name the policy does not allow, reached by address: refused by the capture.
    let name = transparent_line(&lines, "refused.test", allowed_port).expect("name refusal line");
    assert_eq!(name["allowed"], false, "{lines:?}");
    assert_eq!(name["reason"], "not_allowed", "{lines:?}");
    assert!(name["addr"].is_null(), "never dialed: {name}");
    // And by name: the sandbox's resolver answered NXDOMAIN (a refused DNS line); no
    // connection followed.
    let dns = lines
        .iter()
        .find(|l| l["method"] == "DNS" && l["host"] == "refused.test")
        .expect("refused.test DNS line");
    assert_eq!(dns["allowed"], false, "{lines:?}");
    assert_eq!(
        lines.iter().filter(|l| l["host"] == "refused.test" && l["method"] != "DNS").count(),
        1,
        "only the by-address attempt connected: {lines:?}"
    );
}
