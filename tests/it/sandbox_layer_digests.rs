//! Policy loaded once (issue 15): `airlock exec` sends its layers to `airlockd` by content
//! digest (capability `layer_digests`) and both sides keep what they parsed. Proven here with
//! the real binaries and real traffic through the proxy (curl to loopback upstreams the test
//! resolver names): a changed user policy is in force in the very next session (never a
//! stale parse, on either side); a daemon that does not hold a digest (restarted between
//! sessions) is sent the text again; and N-1 works both ways (this CLI with a version-1
//! daemon, a version-1 CLI with this daemon).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Harness, Options};
use crate::support::{World, have};

struct Setup {
    world: World,
    repo: PathBuf,
    resolver: PathBuf,
    /// allowed.test and other.test, both served on 127.0.0.2 at this port.
    port: u16,
}

fn setup(name: &str) -> Setup {
    let world = World::new();
    let repo = world.repo(name);
    let port = crate::support::http_upstream("127.0.0.2", "upstream-ok\n").0;
    let resolver = world
        .write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.2\nother.test 127.0.0.2\n");
    Setup { world, repo, resolver, port }
}

impl Setup {
    /// A user policy allowing `host` at the upstream's port (plus padding entries, so the
    /// layer is not trivially small).
    fn allow_only(&self, host: &str) -> PathBuf {
        let padding: String = (0..500).map(|i| format!("\"pad{i}.example.test\",\n")).collect();
        self.world.write(
            self.world.home.join(".airlock/config.toml"),
            &format!(
                "[network]\nallow = [\n{padding}\"{host}:{}\"]\nallow_private = [\"127.0.0.2/32\"]\n",
                self.port
            ),
        )
    }

    fn daemon(&self, env: Vec<(&'static str, &str)>) -> Harness {
        let mut all = vec![("AIRLOCK_TEST_RESOLVER".into(), self.resolver.clone().into())];
        all.extend(env.into_iter().map(|(k, v)| (k.into(), v.into())));
        Harness::start(&self.world, Options { env: all, ..Default::default() })
    }

    /// What curl gets from each host inside one session: `allowed:<body or error>` lines.
    fn session(&self, h: &Harness, client_protocol: Option<&str>) -> String {
        let script = format!(
            "for h in allowed.test other.test; do echo \"$h:$(curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://$h:{}/)\"; done",
            self.port
        );
        let mut cmd = self
            .world
            .airlock(&self.repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec", "--", "sh", "-c", &script]);
        if let Some(range) = client_protocol {
            cmd = cmd.env("AIRLOCK_TEST_CLIENT_PROTOCOL", range);
        }
        let run = cmd.run();
        assert_eq!(run.code(), 0, "{}\n--- airlockd log\n{}", run.stderr(), h.log());
        run.stdout()
    }

    /// The `policy_layers` of the last session's start record.
    fn last_layers(&self) -> Vec<String> {
        let recs = self.world.session_records(self.repo.file_name().unwrap().to_str().unwrap());
        let start = recs.iter().rev().find(|r| r["kind"] == "start").expect("a start record");
        start["policy_layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }
}

fn user_digest(file: &Path) -> String {
    airlock::config::digest(&std::fs::read(file).unwrap())
}

const ALLOWED_ONLY: &str = "allowed.test:200\nother.test:403\n";
const OTHER_ONLY: &str = "allowed.test:403\nother.test:200\n";

#[test]
fn a_changed_user_policy_is_in_force_in_the_very_next_session() {
    if !have("curl") {
        return;
    }
    let s = setup("digests-changed");
    let h = s.daemon(vec![]);
    let file = s.allow_only("allowed.test");
    let first = user_digest(&file);
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
    // Both sides now hold this policy: the CLI's entry exists, the daemon parsed the text.
    assert!(std::fs::read_dir(s.world.home.join(".airlock/parsed")).unwrap().count() >= 1);
    assert!(s.last_layers().iter().any(|l| l.ends_with(&format!("@sha256:{first}"))));
    // Another host: another digest, so neither cache may serve the old parse.
    s.allow_only("other.test");
    let second = user_digest(&file);
    assert_ne!(first, second);
    assert_eq!(s.session(&h, None), OTHER_ONLY);
    assert!(s.last_layers().iter().any(|l| l.ends_with(&format!("@sha256:{second}"))));
    // Back to the first bytes: both caches hold them, and they apply exactly.
    s.allow_only("allowed.test");
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
    assert!(s.last_layers().iter().any(|l| l.ends_with(&format!("@sha256:{first}"))));
    assert_eq!(h.activations(), 1, "one daemon served all three sessions");
}

#[test]
fn a_restarted_daemon_is_sent_the_layer_text_again() {
    if !have("curl") {
        return;
    }
    let s = setup("digests-restart");
    let h = s.daemon(vec![]);
    s.allow_only("allowed.test");
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
    h.signal(Signal::SIGTERM);
    assert_eq!(h.wait_exits(1, Duration::from_secs(10)), vec![0]);
    // The CLI's cache hits (nothing to parse), the new daemon holds nothing: the digest alone
    // is refused as unknown and the CLI resends the text.
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
    assert_eq!(h.activations(), 2);
}

#[test]
fn this_cli_with_a_version_1_daemon_sends_whole_layers() {
    if !have("curl") {
        return;
    }
    let s = setup("digests-old-daemon");
    let h = s.daemon(vec![("AIRLOCK_TEST_DAEMON_PROTOCOL", "1-1")]);
    s.allow_only("allowed.test");
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
    // A cache hit on the CLI side still gives the old daemon the parsed documents it needs.
    s.allow_only("other.test");
    assert_eq!(s.session(&h, None), OTHER_ONLY);
    s.allow_only("allowed.test");
    assert_eq!(s.session(&h, None), ALLOWED_ONLY);
}

#[test]
fn a_version_1_cli_with_this_daemon_is_served_as_before() {
    if !have("curl") {
        return;
    }
    let s = setup("digests-old-cli");
    let h = s.daemon(vec![]);
    s.allow_only("allowed.test");
    assert_eq!(s.session(&h, Some("1-1")), ALLOWED_ONLY);
    s.allow_only("other.test");
    assert_eq!(s.session(&h, Some("1-1")), OTHER_ONLY);
    // And the same daemon then takes this CLI's digests.
    assert_eq!(s.session(&h, None), OTHER_ONLY);
}
