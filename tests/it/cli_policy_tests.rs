//! Policy tests (`[[test]]` tables) through the real binary: `airlock policy test` exit codes,
//! human and `--json` output, located configuration errors, and every trust-recording command
//! (`policy trust`, `policy allow|deny --yes`, the `exec`/`run` trust check) refusing a file
//! whose tests fail unless `--force`; the managed layer's `require_tests`. Pure: no name is
//! resolved, no socket opened.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Run, World};

const POLICY: &str = "\
[network]
allow = [\"anthropic.com\"]
block = [\"pastebin.com\"]

[[test]]
target = \"api.anthropic.com\"
expect = \"allow\"

[[test]]
target = \"pastebin.com\"
expect = \"deny\"
reason = \"blocked\"
";

/// A failing test: `evil.test` is denied, but as unlisted (`not_allowed`), not `blocked`.
const FAILING: &str = "
[[test]]
target = \"evil.test\"
expect = \"deny\"
reason = \"blocked\"
";

fn world_with(policy: &str) -> (World, PathBuf, PathBuf) {
    let world = World::new();
    let repo = world.repo("app");
    world.write(repo.join(".airlock.toml"), policy);
    let repo = std::fs::canonicalize(repo).unwrap();
    let file = repo.join(".airlock.toml");
    (world, repo, file)
}

fn airlock(world: &World, repo: &Path, args: &[&str]) -> Run {
    world.airlock(repo).args(args).run()
}

/// Whether the repo file is trusted now, as `policy show --json` reports it.
fn trusted(world: &World, repo: &Path) -> bool {
    let run = airlock(world, repo, &["policy", "show", "--json"]);
    let v: Value = serde_json::from_str(&run.stdout()).unwrap();
    v["layers"][2]["trust"]["state"] == "trusted"
}

#[test]
fn policy_test_exits_0_when_all_hold_and_1_when_any_fails() {
    let (world, repo, file) = world_with(POLICY);
    // Untrusted: the tests run against the file as if trusted.
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(0);
    let out = run.stdout();
    assert!(
        out.contains(&format!(
            "ok   api.anthropic.com: expected allow, got allow [allowed] by rule \"anthropic.com\" \
             (repo layer, {})",
            file.display()
        )),
        "{out}"
    );
    assert!(
        out.contains("ok   pastebin.com: expected deny [blocked], got deny [blocked]"),
        "{out}"
    );
    assert!(out.contains("2 tests: 2 passed, 0 failed"), "{out}");
    assert!(!trusted(&world, &repo), "policy test must not record trust");
    let show = airlock(&world, &repo, &["policy", "show"]).stdout();
    assert!(show.contains("  policy tests: 2 (`airlock policy test` runs them)"), "{show}");

    world.write(&file, &format!("{POLICY}{FAILING}"));
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(1);
    let out = run.stdout();
    assert!(
        out.contains(&format!(
            "FAIL evil.test: expected deny [blocked], got deny [not_allowed] (test at {}:15:10)",
            file.display()
        )),
        "{out}"
    );
    assert!(out.contains("3 tests: 2 passed, 1 failed"), "{out}");
}

#[test]
fn policy_test_json_is_the_documented_document() {
    let (world, repo, file) = world_with(&format!("{POLICY}{FAILING}"));
    let run = airlock(&world, &repo, &["policy", "test", "--json"]).expect_code(1);
    let v: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(v["total"], 3);
    assert_eq!(v["passed"], 2);
    assert_eq!(v["failed"], 1);
    assert_eq!(v["require_tests"], false);
    assert_eq!(v["missing_required"], false);
    let t = &v["tests"][1];
    let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "at",
            "expect",
            "expect_reason",
            "got",
            "layer",
            "pass",
            "phase",
            "policy",
            "reason",
            "rule",
            "target",
            "test_layer"
        ]
    );
    assert_eq!(t["target"], "pastebin.com");
    assert_eq!(t["expect"], "deny");
    assert_eq!(t["got"], "deny");
    assert_eq!(t["reason"], "blocked");
    assert_eq!(t["rule"], "pastebin.com");
    assert_eq!(t["layer"], "repo");
    assert_eq!(t["policy"], file.display().to_string());
    assert_eq!(t["test_layer"], "repo");
    assert_eq!(t["pass"], true);
    let f = &v["tests"][2];
    assert_eq!((f["target"].as_str(), f["pass"].as_bool()), (Some("evil.test"), Some(false)));
    assert_eq!(f["reason"], "not_allowed");
    assert_eq!(f["rule"], Value::Null);
}

#[test]
fn no_tests_is_said_and_exits_0() {
    let (world, repo, _) = world_with("[network]\nallow = [\"anthropic.com\"]\n");
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(0);
    assert!(run.stdout().contains("no policy tests: no [[test]] table"), "{}", run.stdout());
}

#[test]
fn user_layer_tests_run_too() {
    let (world, repo, _) = world_with("[network]\nallow = [\"anthropic.com\"]\n");
    let user = world.write(
        world.home.join(".airlock/config.toml"),
        "[[test]]\ntarget = \"https://pastebin.com/raw\"\nexpect = \"allow\"\nreason = \"we paste logs there\"\n",
    );
    let run = airlock(&world, &repo, &["policy", "test", "--json"]).expect_code(1);
    let v: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(v["tests"][0]["test_layer"], "user");
    let at = v["tests"][0]["at"].as_str().unwrap();
    assert!(at.ends_with(".airlock/config.toml:2:10"), "{at} for {}", user.display());
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(1);
    assert!(run.stdout().contains("why this test exists: we paste logs there"), "{}", run.stdout());
}

#[test]
fn bad_tests_are_configuration_errors_at_file_line_col() {
    let (world, repo, file) = world_with(
        "[network]\nallow = [\"a.test\"]\n[[test]]\ntarget = \"a.test:99999\"\nexpect = \"alow\"\nwhy = 1\n",
    );
    let f = file.display();
    for args in [&["policy", "test"][..], &["policy", "trust"][..]] {
        let run = airlock(&world, &repo, args).expect_code(3);
        let err = run.stderr();
        assert!(
            err.contains(&format!("airlock: {f}:4:10: test.target \"a.test:99999\" is malformed")),
            "{err}"
        );
        assert!(err.contains(&format!("airlock: {f}:5:10: test.expect must be \"allow\" or \"deny\", found \"alow\"; did you mean `allow`?")), "{err}");
        assert!(err.contains(&format!("airlock: {f}:6:1: unknown key `why` in [[test]]")), "{err}");
    }
    // `[policy]` belongs to the managed layer only.
    world.write(world.home.join(".airlock/config.toml"), "[policy]\nrequire_tests = true\n");
    world.write(&file, "[network]\nallow = [\"a.test\"]\n");
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(3);
    assert!(
        run.stderr().contains("config.toml:1:2: [policy] is not allowed in the user layer"),
        "{}",
        run.stderr()
    );
}

#[test]
fn policy_trust_refuses_failing_tests_unless_force() {
    let (world, repo, _) = world_with(&format!("{POLICY}{FAILING}"));
    let run = airlock(&world, &repo, &["policy", "trust"]).expect_code(1);
    let err = run.stderr();
    assert!(
        err.contains("airlock: FAIL evil.test: expected deny [blocked], got deny [not_allowed]"),
        "{err}"
    );
    assert!(err.contains("1 of 3 policy tests fail"), "{err}");
    assert!(err.contains("--force"), "{err}");
    assert!(!trusted(&world, &repo));

    let run = airlock(&world, &repo, &["policy", "trust", "--force"]).expect_code(0);
    assert!(run.stderr().contains("trusting anyway (--force)"), "{}", run.stderr());
    assert!(trusted(&world, &repo));
}

#[test]
fn policy_trust_runs_passing_tests_and_trusts() {
    let (world, repo, _) = world_with(POLICY);
    let run = airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    assert!(run.stdout().contains("policy tests: 2 run"), "{}", run.stdout());
    assert!(trusted(&world, &repo));
}

#[test]
fn allow_and_deny_yes_write_the_edit_but_refuse_to_retrust_when_tests_fail() {
    // `policy allow evil.test --yes` makes the test "evil.test is denied" fail.
    let tests = "[[test]]\ntarget = \"evil.test\"\nexpect = \"deny\"\n";
    let (world, repo, file) = world_with(&format!("{POLICY}{tests}"));
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    let run = airlock(&world, &repo, &["policy", "allow", "evil.test", "--yes"]).expect_code(1);
    assert!(run.stderr().contains("FAIL evil.test: expected deny, got allow"), "{}", run.stderr());
    assert!(run.stderr().contains("is written but not trusted"), "{}", run.stderr());
    assert!(std::fs::read_to_string(&file).unwrap().contains("\"evil.test\""));
    assert!(!trusted(&world, &repo));

    // `policy deny api.anthropic.com --yes` breaks the allow test; --force trusts anyway.
    let (world, repo, file) = world_with(POLICY);
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    let run =
        airlock(&world, &repo, &["policy", "deny", "api.anthropic.com", "--yes"]).expect_code(1);
    assert!(
        run.stderr().contains("FAIL api.anthropic.com: expected allow, got deny [blocked]"),
        "{}",
        run.stderr()
    );
    assert!(!trusted(&world, &repo));
    // Back to the trusted content, then the same edit with --force.
    world.write(&file, POLICY);
    assert!(trusted(&world, &repo));
    airlock(&world, &repo, &["policy", "deny", "api.anthropic.com", "--yes", "--force"])
        .expect_code(0);
    assert!(trusted(&world, &repo));
}

#[test]
fn exec_refuses_to_offer_trust_for_a_file_whose_tests_fail() {
    let (world, repo, _) = world_with(&format!("{POLICY}{FAILING}"));
    let run = world.airlock(&repo).args(["exec", "--", "true"]).run().expect_code(125);
    let err = run.stderr();
    assert!(
        err.contains("FAIL evil.test: expected deny [blocked], got deny [not_allowed]"),
        "{err}"
    );
    assert!(err.contains("airlock policy trust --force"), "{err}");
    assert!(!trusted(&world, &repo));
}

#[cfg(feature = "test-hooks")] // writes the managed layer (AIRLOCK_TEST_MANAGED_POLICY)
#[test]
fn managed_require_tests_refuses_a_file_without_tests_even_with_force() {
    let (world, repo, file) = world_with("[network]\nallow = [\"anthropic.com\"]\n");
    world.write(&world.managed, "[policy]\nrequire_tests = true\n");
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(1);
    assert!(run.stderr().contains("the managed policy requires policy tests"), "{}", run.stderr());
    let run = airlock(&world, &repo, &["policy", "test", "--json"]).expect_code(1);
    let v: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(
        (v["require_tests"].as_bool(), v["missing_required"].as_bool()),
        (Some(true), Some(true))
    );
    for args in [&["policy", "trust"][..], &["policy", "trust", "--force"][..]] {
        let run = airlock(&world, &repo, args).expect_code(1);
        assert!(
            run.stderr().contains("the managed policy requires policy tests"),
            "{}",
            run.stderr()
        );
        assert!(run.stderr().contains("--force does not lift this"), "{}", run.stderr());
    }
    assert!(!trusted(&world, &repo));
    world.write(&file, POLICY);
    airlock(&world, &repo, &["policy", "test"]).expect_code(0);
    airlock(&world, &repo, &["policy", "trust"]).expect_code(0);
    assert!(trusted(&world, &repo));
}

/// A test may name a phase: it is decided with `[phase.NAME.network]` in force, so a phase's
/// lists are reviewed in a pull request like the plain ones; a phase no layer defines is a
/// configuration error located at the test (exit 3), never a silently plain decision.
#[test]
fn a_test_naming_a_phase_is_decided_in_that_phase() {
    let policy = "\
[network]
allow = [\"anthropic.com\"]

[phase.build.network]
allow = [\"pypi.org\"]

[[test]]
target = \"pypi.org\"
expect = \"deny\"

[[test]]
target = \"pypi.org\"
expect = \"allow\"
phase = \"build\"

[[test]]
target = \"api.anthropic.com\"
expect = \"deny\"
reason = \"not_allowed\"
phase = \"build\"
";
    let (world, repo, file) = world_with(policy);
    let run = airlock(&world, &repo, &["policy", "test", "--json"]).expect_code(0);
    let v: Value = serde_json::from_str(&run.stdout()).unwrap();
    let phases: Vec<&Value> = v["tests"].as_array().unwrap().iter().map(|t| &t["phase"]).collect();
    assert_eq!(phases, [&Value::Null, &Value::from("build"), &Value::from("build")], "{v}");
    assert_eq!(v["passed"], 3, "{v}");

    // The same expectation without the phase fails: the plain lists do not allow pypi.org.
    world.write(
        &file,
        &policy.replace("expect = \"allow\"\nphase = \"build\"", "expect = \"allow\""),
    );
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(1);
    assert!(run.stdout().contains("FAIL pypi.org: expected allow, got deny"), "{}", run.stdout());

    world.write(&file, &policy.replace("phase = \"build\"\n", "phase = \"bulid\"\n"));
    let run = airlock(&world, &repo, &["policy", "test"]).expect_code(3);
    let err = run.stderr();
    assert!(err.contains(&format!("{}:12:10: test.phase:", file.display())), "{err}");
    assert!(err.contains("bulid"), "{err}");

    world.write(&file, &policy.replace("phase = \"build\"\n", "phase = \"Build!\"\n"));
    let err = airlock(&world, &repo, &["policy", "test"]).expect_code(3).stderr();
    assert!(err.contains("test.phase \"Build!\" is not a phase name"), "{err}");
}
