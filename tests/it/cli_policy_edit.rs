//! `airlock policy allow | deny`, `policy check --resolve` and the trust review through the real
//! binary. `--resolve` resolves only through the test resolver (names mapped to 127.0.0.x) or
//! IP literals: nothing here reaches real DNS or opens a socket.

use std::path::{Path, PathBuf};

use crate::support::{Run, World};

const COMMENTED: &str = "# our team's policy: keep this comment\n[network]\nallow = [\n  \"crates.io\", # rust\n  \"github.com\",\n]\n";

/// A world with repo `app` (its `.airlock.toml` = `policy`) and a user layer allowing one
/// unrelated name, so a policy always builds while the repo file is untrusted.
fn world_with(policy: Option<&str>) -> (World, PathBuf) {
    let world = World::new();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"base.test\"]\n");
    let repo = world.repo("app");
    if let Some(p) = policy {
        world.write(repo.join(".airlock.toml"), p);
    }
    let repo = std::fs::canonicalize(repo).unwrap();
    (world, repo)
}

fn airlock(world: &World, repo: &Path, args: &[&str]) -> Run {
    world.airlock(repo).args(args).run()
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn allow_keeps_comments_shows_the_diff_and_trusts_only_with_yes() {
    let (world, repo) = world_with(Some(COMMENTED));
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    let file = repo.join(".airlock.toml");

    // No terminal, no --yes: written, not trusted, and the message says how to trust.
    let run = airlock(&world, &repo, &["policy", "allow", "pypi.org"]).expect_code(0);
    let want = "# our team's policy: keep this comment\n[network]\nallow = [\n  \"crates.io\", # rust\n  \"github.com\",\n  \"pypi.org\",\n]\n";
    assert_eq!(read(&file), want);
    let out = run.stdout();
    assert!(out.contains("\n+  \"pypi.org\",\n"), "the diff: {out}");
    assert!(out.contains("(before)") && out.contains("(after)"), "{out}");
    assert!(out.contains("not trusted") && out.contains("airlock policy trust --repo"), "{out}");
    airlock(&world, &repo, &["policy", "check", "pypi.org"]).expect_code(1);

    // Idempotent: present → said so, nothing changed (not even the mtime's content).
    let again = airlock(&world, &repo, &["policy", "allow", "PyPI.org"]).expect_code(0);
    assert!(again.stdout().contains("already in [network] allow"), "{}", again.stdout());
    assert_eq!(read(&file), want);

    // The edited file was untrusted before this second edit: --yes does not trust it.
    let run =
        airlock(&world, &repo, &["policy", "allow", "files.test:8443", "--yes"]).expect_code(0);
    assert!(run.stdout().contains("stays untrusted"), "{}", run.stdout());
    airlock(&world, &repo, &["policy", "check", "files.test:8443"]).expect_code(1);

    // Trusted again, then --yes re-trusts exactly the edit.
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    let run = airlock(&world, &repo, &["policy", "allow", "ssh.test:22", "--yes"]).expect_code(0);
    assert!(run.stdout().contains("trusted; recorded in"), "{}", run.stdout());
    airlock(&world, &repo, &["policy", "check", "ssh.test:22"]).expect_code(0);
    airlock(&world, &repo, &["policy", "check", "pypi.org"]).expect_code(0);
    assert!(read(&file).starts_with("# our team's policy: keep this comment\n"));
}

#[test]
fn allow_creates_the_file_and_deny_edits_the_user_layer() {
    let (world, repo) = world_with(None);
    let run = airlock(&world, &repo, &["policy", "allow", "pypi.org", "--yes"]).expect_code(0);
    assert_eq!(read(repo.join(".airlock.toml")), "[network]\nallow = [\"pypi.org\"]\n");
    assert!(run.stdout().contains("--- /dev/null"), "{}", run.stdout());
    airlock(&world, &repo, &["policy", "check", "pypi.org"]).expect_code(0);

    let user = world.write(
        world.home.join(".airlock/config.toml"),
        "# mine\n[network]\nallow = [\"pypi.org\"]\n",
    );
    std::fs::remove_file(repo.join(".airlock.toml")).unwrap();
    airlock(&world, &repo, &["policy", "deny", "files.pypi.org", "--layer", "user"]).expect_code(0);
    assert_eq!(
        read(&user),
        "# mine\n[network]\nallow = [\"pypi.org\"]\nblock = [\"files.pypi.org\"]\n"
    );
    airlock(&world, &repo, &["policy", "check", "files.pypi.org"]).expect_code(1);
    airlock(&world, &repo, &["policy", "check", "pypi.org"]).expect_code(0);
}

#[test]
fn bad_entries_and_files_are_refused_and_nothing_is_lost() {
    let (world, repo) = world_with(Some("[network]\nallow = \"not-an-array.test\"\n"));
    let file = repo.join(".airlock.toml");
    let run = airlock(&world, &repo, &["policy", "allow", "bad host"]).expect_code(2);
    assert!(run.stderr().contains("entry syntax"), "{}", run.stderr());
    let run = airlock(&world, &repo, &["policy", "allow", "a.test"]).expect_code(3);
    assert!(run.stderr().contains("not an array"), "{}", run.stderr());
    assert_eq!(read(&file), "[network]\nallow = \"not-an-array.test\"\n");

    // A repo file that is a symlink (the agent's tree) is never followed nor written through.
    std::fs::remove_file(&file).unwrap();
    let target = world.write(world.tmp.path().join("elsewhere.toml"), "# outside\n");
    std::os::unix::fs::symlink(&target, &file).unwrap();
    let run = airlock(&world, &repo, &["policy", "allow", "a.test"]).expect_code(3);
    assert!(run.stderr().contains("symlink"), "{}", run.stderr());
    assert_eq!(read(&target), "# outside\n");
}

#[test]
fn trust_review_is_a_real_diff_with_call_outs() {
    let (world, repo) = world_with(Some("# v1\n[network]\nallow = [\"a.test\"]\n"));
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    world.write(
        repo.join(".airlock.toml"),
        "# v1\n[network]\nmode = \"blocklist\"\nallow = [\"a.test\"]\nallow_private = [\"10.0.0.0/8\"]\n",
    );
    let show = airlock(&world, &repo, &["policy", "show"]).expect_code(0);
    let err = show.stderr();
    assert!(err.contains("!! it sets mode = \"blocklist\""), "{err}");
    assert!(err.contains("!! it adds allow_private 10.0.0.0/8"), "{err}");
    let run = airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    let out = run.stdout();
    assert!(out.contains("(trusted)") && out.contains("(now)"), "{out}");
    assert!(out.contains("\n  +mode = \"blocklist\"\n"), "{out}");
    assert!(out.contains("\n   # v1\n"), "an unchanged context line: {out}");
    assert!(!out.contains("+# v1"), "unchanged lines are not shown as added: {out}");
    assert!(out.contains("!! it sets mode = \"blocklist\""), "{out}");
}

#[cfg(feature = "test-hooks")]
mod resolve {
    use super::*;
    use serde_json::Value;

    fn check(world: &World, repo: &Path, resolver: &Path, args: &[&str]) -> Run {
        world
            .airlock(repo)
            .args(["policy", "check", "--resolve"])
            .args(args)
            .hook("AIRLOCK_TEST_RESOLVER", resolver)
            .run()
    }

    fn json(run: &Run) -> Value {
        serde_json::from_str(run.stdout().trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout(), run.stderr()))
    }

    #[test]
    fn resolve_prints_each_answer_and_exits_0_1_or_4() {
        let (world, repo) = world_with(None);
        world.write(
            world.home.join(".airlock/config.toml"),
            "[network]\nallow = [\"good.test\", \"mixed.test\", \"gone.test\"]\n\
             allow_private = [\"127.0.0.2/32\"]\n",
        );
        let resolver = world.write(
            world.tmp.path().join("resolver"),
            "good.test 127.0.0.2\nmixed.test 127.0.0.2 127.0.0.3\n",
        );
        let run = check(&world, &repo, &resolver, &["good.test"]).expect_code(0);
        assert!(run.stdout().contains("answer 127.0.0.2: allow"), "{}", run.stdout());
        assert!(run.stderr().contains("TEST RESOLVER IN FORCE"), "{}", run.stderr());

        let run = check(&world, &repo, &resolver, &["mixed.test"]).expect_code(1);
        assert!(
            run.stdout().contains("answer 127.0.0.3: deny [private_address]"),
            "{}",
            run.stdout()
        );
        assert!(run.stderr().contains("allow_private"), "the fix: {}", run.stderr());
        // Without --resolve the same target is allowed: the pure check cannot see answers.
        world.airlock(&repo).args(["policy", "check", "mixed.test"]).run().expect_code(0);

        let run = check(&world, &repo, &resolver, &["gone.test"]).expect_code(4);
        assert!(run.stderr().contains("cannot resolve gone.test"), "{}", run.stderr());

        // A refused name is never resolved (exit 1, as without --resolve).
        let run = check(&world, &repo, &resolver, &["other.test"]).expect_code(1);
        assert!(run.stdout().contains("not resolved"), "{}", run.stdout());

        let run = check(&world, &repo, &resolver, &["--json", "mixed.test"]).expect_code(1);
        let v = json(&run);
        assert_eq!(v["verdict"], "allow", "the policy's verdict: {v}");
        assert_eq!(
            v["answers"],
            serde_json::json!([
                {"addr": "127.0.0.2", "verdict": "allow", "reason": "allowed"},
                {"addr": "127.0.0.3", "verdict": "deny", "reason": "private_address"},
            ])
        );
        let run = check(&world, &repo, &resolver, &["--json", "gone.test"]).expect_code(4);
        let v = json(&run);
        assert_eq!(v["answers"], serde_json::json!([]));
        assert!(v["resolve_error"].as_str().unwrap().contains("gone.test"), "{v}");
        // Without --resolve the JSON keeps exactly its old keys.
        let run = world.airlock(&repo).args(["policy", "check", "--json", "good.test"]).run();
        assert!(json(&run).get("answers").is_none());
    }

    #[test]
    fn resolve_of_an_ip_literal_runs_the_guard_without_a_lookup() {
        let (world, repo) = world_with(None);
        world.write(
            world.home.join(".airlock/config.toml"),
            "[network]\nallow = [\"127.0.0.5\"]\nallow_private = [\"127.0.0.5/32\"]\n",
        );
        let resolver = world.write(world.tmp.path().join("resolver"), "");
        let run = check(&world, &repo, &resolver, &["--json", "127.0.0.5"]).expect_code(0);
        assert_eq!(
            json(&run)["answers"],
            serde_json::json!([{"addr": "127.0.0.5", "verdict": "allow", "reason": "allowed"}])
        );
    }
}
