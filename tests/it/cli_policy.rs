//! `airlock policy check | show | trust` through the real binary: issue 2's "Done when", trust
//! by content hash, managed-layer pinning and gating, configuration errors, `--json` shape.
//! `policy check` is pure: none of these tests resolves a name or opens a socket.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Run, World};

const REPO_POLICY: &str = "[network]\nallow = [\"anthropic.com\"]\n";

/// A world with repo `app` whose `.airlock.toml` allows `anthropic.com`.
fn world_with_repo(policy: &str) -> (World, PathBuf, PathBuf) {
    let world = World::new();
    let repo = world.repo("app");
    let file = world.write(repo.join(".airlock.toml"), policy);
    let repo = std::fs::canonicalize(repo).unwrap();
    let file = repo.join(file.file_name().unwrap());
    (world, repo, file)
}

fn check(world: &World, repo: &Path, target: &str) -> Run {
    world.airlock(repo).args(["policy", "check", target]).run()
}

fn check_json(world: &World, repo: &Path, target: &str) -> (i32, Value) {
    let run = world.airlock(repo).args(["policy", "check", "--json", target]).run();
    let v: Value = serde_json::from_str(run.stdout().trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout(), run.stderr()));
    (run.code(), v)
}

fn trust(world: &World, repo: &Path) -> Run {
    world.airlock(repo).args(["policy", "trust"]).run().expect_code(0)
}

#[test]
fn done_when_trusted_repo_allows_anthropic() {
    let (world, repo, file) = world_with_repo(REPO_POLICY);
    let t = trust(&world, &repo);
    assert!(t.stdout().contains(&format!("trusting {}", file.display())), "{}", t.stdout());
    assert!(t.stdout().contains("allow: anthropic.com"), "{}", t.stdout());

    let run = check(&world, &repo, "api.anthropic.com").expect_code(0);
    assert_eq!(
        run.stdout().trim(),
        format!(
            "allow api.anthropic.com:443 by rule \"anthropic.com\" (repo layer, {})",
            file.display()
        )
    );

    let run = check(&world, &repo, "pastebin.com").expect_code(1);
    assert!(run.stdout().starts_with("deny pastebin.com:443: "), "{}", run.stdout());
    assert!(run.stdout().contains("[not_allowed]"), "{}", run.stdout());

    let run = check(&world, &repo, "2130706433").expect_code(2);
    let err = run.stderr();
    assert!(err.starts_with("airlock: malformed target \"2130706433\": "), "{err}");
    assert!(err.to_lowercase().contains("numeric") || err.contains("IPv4"), "{err}");
}

#[test]
fn done_when_editing_the_file_untrusts_it_until_trusted_again() {
    let (world, repo, file) = world_with_repo(REPO_POLICY);
    // A user-layer entry keeps the allowlist non-empty while the repo file does not apply.
    world
        .write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"=example.test\"]\n");

    let run = check(&world, &repo, "api.anthropic.com").expect_code(1);
    assert!(
        run.stderr().contains(&format!("{} is not trusted", file.display())),
        "{}",
        run.stderr()
    );
    assert!(run.stderr().contains("airlock policy trust"), "{}", run.stderr());

    trust(&world, &repo);
    check(&world, &repo, "api.anthropic.com").expect_code(0);

    world.write(&file, "[network]\nallow = [\"anthropic.com\", \"pastebin.com\"]\n");
    let run = check(&world, &repo, "api.anthropic.com").expect_code(1);
    assert!(run.stderr().contains("changed since it was trusted"), "{}", run.stderr());
    let run = check(&world, &repo, "pastebin.com").expect_code(1);
    assert!(run.stderr().contains("changed since it was trusted"), "{}", run.stderr());

    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    assert!(run.stdout().contains("UNTRUSTED, not applied"), "{}", run.stdout());
    assert!(run.stdout().contains("allow: anthropic.com, pastebin.com"), "{}", run.stdout());

    trust(&world, &repo);
    check(&world, &repo, "pastebin.com").expect_code(0);
    check(&world, &repo, "api.anthropic.com").expect_code(0);
}

#[test]
fn untrusted_repo_alone_means_an_empty_allowlist() {
    let (world, repo, _file) = world_with_repo(REPO_POLICY);
    let run = check(&world, &repo, "api.anthropic.com").expect_code(3);
    let err = run.stderr();
    assert!(err.contains("is not trusted"), "{err}");
    assert!(err.contains("airlock: refusing to start: the allowlist is empty"), "{err}");
    assert!(err.contains("allow = [\"api.anthropic.com\"]"), "{err}");
}

#[test]
fn no_configuration_at_all_refuses_to_start() {
    let world = World::new();
    let repo = world.repo("bare");
    let run = check(&world, &repo, "example.test").expect_code(3);
    assert!(run.stderr().starts_with("airlock: refusing to start: the allowlist is empty"));
}

#[test]
fn json_has_exactly_the_contract_keys() {
    let (world, repo, file) = world_with_repo(REPO_POLICY);
    trust(&world, &repo);
    let keys = ["verdict", "host", "port", "rule", "layer", "policy", "reason"];
    let (code, v) = check_json(&world, &repo, "https://API.Anthropic.com./v1/messages");
    assert_eq!(code, 0);
    let obj = v.as_object().unwrap();
    assert_eq!(obj.len(), keys.len(), "{v}");
    for k in keys {
        assert!(obj.contains_key(k), "missing {k} in {v}");
    }
    assert_eq!(v["verdict"], "allow");
    assert_eq!(v["host"], "api.anthropic.com");
    assert_eq!(v["port"], 443);
    assert_eq!(v["rule"], "anthropic.com");
    assert_eq!(v["layer"], "repo");
    assert_eq!(v["policy"], file.display().to_string());
    assert_eq!(v["reason"], "allowed");

    let (code, v) = check_json(&world, &repo, "pastebin.com:8080");
    assert_eq!(code, 1);
    assert_eq!(v["verdict"], "deny");
    assert_eq!(v["port"], 8080);
    assert_eq!(v["rule"], Value::Null);
    assert_eq!(v["layer"], "none");
    assert_eq!(v["policy"], Value::Null);
    assert_eq!(v["reason"], "not_allowed");

    let (code, v) = check_json(&world, &repo, "http://anthropic.com");
    assert_eq!(code, 0);
    assert_eq!(v["port"], 80);

    for bad in ["user@host.com", "host%2ecom", "0177.0.0.1", "a..b", "-a.com", "fe80::1%eth0"] {
        let (code, v) = check_json(&world, &repo, bad);
        assert_eq!(code, 2, "{bad}: {v}");
        assert_eq!(v.as_object().unwrap().len(), keys.len());
        assert_eq!(v["verdict"], "malformed");
        assert_eq!(v["host"], bad);
        assert_eq!(v["port"], Value::Null);
        assert_eq!(v["reason"], "malformed");
    }
}

#[cfg(feature = "test-hooks")] // writes the managed layer (AIRLOCK_TEST_MANAGED_POLICY)
#[test]
fn managed_layer_pins_the_mode_and_gates_allows() {
    let (world, repo, _file) =
        world_with_repo("[network]\nallow = [\"anthropic.com\", \"pastebin.com\"]\n");
    trust(&world, &repo);
    world.write(world.home.join(".airlock/config.toml"), "[network]\nmode = \"blocklist\"\n");

    // Without a managed layer the user's blocklist mode applies: unlisted hosts pass.
    let run = world.airlock(&repo).args(["policy", "show", "--json"]).run().expect_code(0);
    let v: Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(v["mode"], "blocklist");
    assert_eq!(v["mode_source"]["layer"], "user");
    check(&world, &repo, "unlisted.test").expect_code(0);

    // A managed mode pins; a managed allow gates user∪repo in both modes.
    world.write(&world.managed, "[network]\nmode = \"allowlist\"\nallow = [\"anthropic.com\"]\n");
    let run = world.airlock(&repo).args(["policy", "show", "--json"]).run().expect_code(0);
    let v: Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(v["mode"], "allowlist");
    assert_eq!(v["mode_source"]["layer"], "managed");
    assert_eq!(v["mode_source"]["pinned"], true);
    assert!(v["overrides"][0].as_str().unwrap().contains("AIRLOCK_TEST_MANAGED_POLICY"));

    check(&world, &repo, "api.anthropic.com").expect_code(0);
    check(&world, &repo, "unlisted.test").expect_code(1);
    assert_eq!(v["shadowed"], serde_json::json!(["pastebin.com (repo layer)"]));
    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    let out = run.stdout();
    assert!(out.contains("mode: allowlist (pinned by the managed layer, "), "{out}");
    assert!(
        out.contains("shadowed by the managed layer (no effect):\n  pastebin.com (repo layer)"),
        "{out}"
    );
    assert!(out.contains("effective policy sha256: "), "{out}");
    let (code, v) = check_json(&world, &repo, "pastebin.com");
    assert_eq!(code, 1);
    assert_eq!(v["reason"], "managed_not_allowed");
    assert_eq!(v["layer"], "managed");
    assert_eq!(v["policy"], world.managed.display().to_string());

    // A managed block beats every allow.
    world.write(&world.managed, "[network]\nblock = [\"api.anthropic.com\"]\n");
    let (code, v) = check_json(&world, &repo, "api.anthropic.com");
    assert_eq!(code, 1);
    assert_eq!(v["reason"], "blocked");
    assert_eq!(v["rule"], "api.anthropic.com");
    assert_eq!(v["layer"], "managed");
}

#[test]
fn review_plane_servers_are_always_blocked() {
    let (world, repo, _file) = world_with_repo("[network]\nallow = [\"corp.test\"]\n");
    trust(&world, &repo);
    world.write(
        world.home.join(".airlock/config.toml"),
        "[review]\nservers = [\"https://review.corp.test:8443\"]\n",
    );
    check(&world, &repo, "git.corp.test").expect_code(0);
    let (code, v) = check_json(&world, &repo, "review.corp.test");
    assert_eq!(code, 1);
    assert_eq!(v["reason"], "review_plane");

    // In the repo layer, [review] is a configuration error once the file applies.
    world.write(
        repo.join(".airlock.toml"),
        "[network]\nallow = [\"corp.test\"]\n[review]\nservers = [\"x.test\"]\n",
    );
    let run = world.airlock(&repo).args(["policy", "trust"]).run().expect_code(3);
    let file = repo.join(".airlock.toml");
    assert!(
        run.stderr().contains(&format!("airlock: {}:3:2: [review] is not allowed", file.display())),
        "{}",
        run.stderr()
    );
}

#[cfg(feature = "test-hooks")] // writes the managed layer (AIRLOCK_TEST_MANAGED_POLICY)
#[test]
fn configuration_errors_exit_3_with_file_line_col() {
    let (world, repo, _file) = world_with_repo(REPO_POLICY);
    trust(&world, &repo);
    let user = world.write(world.home.join(".airlock/config.toml"), "[network]\nalow = []\n");
    let run = check(&world, &repo, "api.anthropic.com").expect_code(3);
    assert_eq!(
        run.stderr().trim(),
        "airlock: ~/.airlock/config.toml:2:1: unknown key `alow` in [network]; did you mean `allow`?"
    );
    world.write(&user, "[network]\nallow = [\"ok.test\", \"10.0.0.1/8\"]\n");
    let run = check(&world, &repo, "api.anthropic.com").expect_code(3);
    assert!(
        run.stderr().starts_with("airlock: ~/.airlock/config.toml:2:21: network.allow entry"),
        "{}",
        run.stderr()
    );
    world.write(&user, "[network\n");
    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(3);
    assert!(run.stderr().starts_with("airlock: ~/.airlock/config.toml:1:"), "{}", run.stderr());
    world.write(&world.managed, "[network]\nallow = [\"a.test:0\"]\n");
    std::fs::remove_file(&user).unwrap();
    let run = check(&world, &repo, "api.anthropic.com").expect_code(3);
    let prefix =
        format!("airlock: {}:2:10: network.allow entry \"a.test:0\"", world.managed.display());
    assert!(run.stderr().starts_with(&prefix), "{}", run.stderr());
}

#[test]
fn untrusted_file_errors_show_but_never_exit_3() {
    let (world, repo, file) = world_with_repo("[network]\nallow = [\"a..b\"]\n");
    world
        .write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"=example.test\"]\n");
    check(&world, &repo, "example.test").expect_code(0);
    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    assert!(
        run.stdout()
            .contains(&format!("error: {}:2:10: network.allow entry \"a..b\"", file.display())),
        "{}",
        run.stdout()
    );
    let run = world.airlock(&repo).args(["policy", "trust"]).run().expect_code(3);
    assert!(run.stderr().contains("refusing to trust"), "{}", run.stderr());
    // Nothing was recorded: the file still does not apply.
    assert!(!world.home.join(".airlock/trust").exists());
}

#[test]
fn warnings_are_reported_and_evaluation_continues() {
    let (world, repo, file) = world_with_repo(
        "[network]\nallow = [\"anthropic.com\", \"anthropic.com\", \"pastebin.com\"]\nblock = [\"pastebin.com\"]\n",
    );
    trust(&world, &repo);
    let run = check(&world, &repo, "pastebin.com").expect_code(1);
    let err = run.stderr();
    assert!(
        err.contains(&format!(
            "airlock: {}:2:27: warning: \"anthropic.com\" is listed twice",
            file.display()
        )),
        "{err}"
    );
    assert!(err.contains("block wins"), "{err}");
    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    assert!(run.stdout().contains("warnings:"), "{}", run.stdout());
}

#[cfg(feature = "test-hooks")] // shows the test overrides in force
#[test]
fn show_prints_layers_trust_and_overrides_loudly() {
    let (world, repo, file) = world_with_repo(
        "[network]\nallow = [\"anthropic.com\"]\nallow_private = [\"127.0.0.2/32\"]\n[env]\npass = [\"RUST_LOG\"]\n[mcp.gh]\nTOKEN = { from_env = \"GH\" }\n",
    );
    trust(&world, &repo);
    let run = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    let out = run.stdout();
    assert!(out.contains("!!! TEST OVERRIDE IN FORCE: managed policy path replaced by"), "{out}");
    assert!(run.stderr().contains("TEST OVERRIDE IN FORCE"), "{}", run.stderr());
    assert!(out.contains("mode: allowlist (default)"), "{out}");
    assert!(out.contains(&format!("repo layer: {} (trusted, applied)", file.display())), "{out}");
    assert!(out.contains("user layer: ~/.airlock/config.toml (absent)"), "{out}");
    assert!(out.contains("allow_private: 127.0.0.2/32"), "{out}");
    assert!(out.contains("env pass: RUST_LOG"), "{out}");
    assert!(out.contains("mcp: gh: TOKEN"), "{out}");
    let digest = sha256_hex(&std::fs::read(&file).unwrap());
    assert!(out.contains(&format!("sha256: {digest}")), "{out}");

    let run = world.airlock(&repo).args(["policy", "show", "--json"]).run().expect_code(0);
    let v: Value = serde_json::from_str(&run.stdout()).unwrap();
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    assert_eq!(layers[2]["layer"], "repo");
    assert_eq!(layers[2]["applied"], true);
    assert_eq!(layers[2]["trust"]["state"], "trusted");
    assert_eq!(layers[2]["digest"], digest);
    assert_eq!(layers[0]["present"], false);
}

#[test]
fn trust_records_are_private_and_keyed_by_repo() {
    let (world, repo, file) = world_with_repo(REPO_POLICY);
    trust(&world, &repo);
    let dir = world.home.join(".airlock/trust");
    let all: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    // Beside the record: the trusted bytes (for the next review's diff), private too.
    let (copies, entries): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|p| p.extension().is_some_and(|e| e == "content"));
    assert_eq!(entries.len(), 1);
    assert_eq!(copies.len(), 1);
    assert_eq!(std::fs::read_to_string(&copies[0]).unwrap(), REPO_POLICY);
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&copies[0]).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let name = entries[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("app-") && name.len() == "app-".len() + 8, "{name}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&entries[0]).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let record = std::fs::read_to_string(&entries[0]).unwrap();
    assert!(record.contains(&sha256_hex(&std::fs::read(&file).unwrap())), "{record}");
    assert!(record.contains(&file.display().to_string()), "{record}");
    assert!(record.contains("trusted_at"), "{record}");
    // Trusting the same content again is a no-op that says so.
    let run = trust(&world, &repo);
    assert!(run.stdout().contains("already trusted"), "{}", run.stdout());
    // --repo from elsewhere names the same repo.
    let elsewhere = world.tmp.path().to_path_buf();
    world
        .airlock(&elsewhere)
        .args(["policy", "check", "--repo"])
        .args([&repo])
        .args(["api.anthropic.com"])
        .run()
        .expect_code(0);
    // A trust command without a file says what to do.
    let bare = world.repo("bare");
    let run = world.airlock(&bare).args(["policy", "trust"]).run().expect_code(3);
    assert!(run.stderr().contains("there is no"), "{}", run.stderr());
}

#[test]
fn help_version_and_completions() {
    let world = World::new();
    let cwd = world.tmp.path().to_path_buf();
    let run = world.airlock(&cwd).args(["--help"]).run().expect_code(0);
    let help = run.stdout();
    for cmd in
        ["policy", "login", "whoami", "logout", "completions", "logs", "exec", "run", "publish"]
    {
        assert!(help.contains(cmd), "{help}");
    }
    assert!(!help.contains("__audit-hold"), "an internal command is listed:\n{help}");
    let run = world.airlock(&cwd).args(["--version"]).run().expect_code(0);
    assert_eq!(run.stdout().trim(), format!("airlock {}", env!("CARGO_PKG_VERSION")));
    for shell in ["bash", "zsh", "fish"] {
        let run = world.airlock(&cwd).args(["completions", shell]).run().expect_code(0);
        assert!(run.stdout().contains("policy"), "{shell}");
    }
    world.airlock(&cwd).args(["completions", "nosuchshell"]).run().expect_code(2);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn a_symlinked_or_special_repo_file_never_applies_and_cannot_be_trusted() {
    let world = World::new();
    let repo = world.repo("app");
    let target = world.write(world.tmp.path().join("elsewhere.toml"), REPO_POLICY);
    std::os::unix::fs::symlink(&target, repo.join(".airlock.toml")).unwrap();
    world
        .write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"=example.test\"]\n");
    let run = check(&world, &repo, "api.anthropic.com").expect_code(1);
    assert!(run.stderr().contains("it is a symlink"), "{}", run.stderr());
    let run = world.airlock(&repo).args(["policy", "trust"]).run().expect_code(3);
    assert!(run.stderr().contains("refusing to trust"), "{}", run.stderr());
    world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);

    // A FIFO in its place must not hang the command.
    std::fs::remove_file(repo.join(".airlock.toml")).unwrap();
    nix::unistd::mkfifo(
        &repo.join(".airlock.toml"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let run = check(&world, &repo, "example.test").expect_code(0);
    assert!(run.stderr().contains("not a regular file"), "{}", run.stderr());
}

#[test]
fn malformed_targets_exit_2_with_the_reason() {
    let (world, repo, _file) = world_with_repo(REPO_POLICY);
    trust(&world, &repo);
    let long_name = format!("{}.com", vec!["a".repeat(60); 5].join("."));
    let long_label = format!("{}.com", "a".repeat(64));
    for bad in [
        "",
        long_name.as_str(),
        long_label.as_str(),
        "a..b",
        "-a.com",
        "2130706433",
        "0177.0.0.1",
        "0x7f.1",
        "127.1",
        "user@host.com",
        "host%2ecom",
        "fe80::1%eth0",
        "[example.com]:443",
        "example.com:0",
        "example.com:65536",
    ] {
        let run = check(&world, &repo, bad);
        assert_eq!(run.code(), 2, "{bad:?}: {}", run.stderr());
        let err = run.stderr();
        let prefix = format!("airlock: malformed target {bad:?}: ");
        assert!(err.starts_with(&prefix), "{err}");
        assert!(err.trim_end().len() > prefix.len() + 10, "no reason given: {err}");
    }
    // Valid unusual forms are decided, not refused as malformed.
    for ok in ["[::ffff:127.0.0.1]:443", "API.ANTHROPIC.COM.", "https://api.anthropic.com:443/x"] {
        let code = check(&world, &repo, ok).code();
        assert!(code == 0 || code == 1, "{ok}: exit {code}");
    }
}

#[cfg(feature = "test-hooks")] // writes the managed layer (AIRLOCK_TEST_MANAGED_POLICY)
#[test]
fn policy_show_names_the_terminal_clipboard_setting() {
    let (world, repo, _file) = world_with_repo("[network]\nallow = [\"example.test\"]\n");
    trust(&world, &repo);
    let show = |world: &World| {
        let run = world.airlock(&repo).args(["policy", "show", "--json"]).run().expect_code(0);
        serde_json::from_str::<Value>(&run.stdout()).unwrap()["terminal_clipboard"].clone()
    };
    assert_eq!(show(&world), "deny");
    world.write(world.home.join(".airlock/config.toml"), "[terminal]\nclipboard = \"allow\"\n");
    assert_eq!(show(&world), "allow");
    let text = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0).stdout();
    assert!(text.contains("terminal clipboard: allow"), "{text}");
    // A managed deny wins.
    world.write(&world.managed, "[terminal]\nclipboard = \"deny\"\n");
    assert_eq!(show(&world), "deny");
}

/// `[gate]` (docs/gates.md): `policy check` says an allowed target is held for a decision and
/// by which entry; a refused one is just refused; `policy show` and the trust prompt list the
/// gates; a mistake is located.
#[test]
fn gated_targets_are_reported_by_check_show_and_trust() {
    let (world, repo, file) = world_with_repo(
        "[network]\nallow = [\"pay.test\", \"other.test\"]\n[gate]\nhosts = [\"pay.test\"]\n\
         timeout = \"30s\"\n[[gate.rule]]\nhost = \"=api.pay.test\"\nseverity = \"high\"\n",
    );
    let t = trust(&world, &repo);
    assert!(
        t.stdout().contains("gates: pay.test (medium), =api.pay.test (high)"),
        "{}",
        t.stdout()
    );
    let (code, v) = check_json(&world, &repo, "api.pay.test");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["verdict"], "allow");
    assert_eq!(v["gate"]["rule"], "=api.pay.test");
    assert_eq!(v["gate"]["severity"], "high");
    assert_eq!(v["gate"]["layer"], "repo");
    assert_eq!(v["gate"]["policy"], file.display().to_string());
    assert_eq!(v["gate"]["timeout_secs"], 30);
    let run = check(&world, &repo, "www.pay.test").expect_code(0);
    assert!(
        run.stdout().contains("\n  gated: held until a person approves it"),
        "{}",
        run.stdout()
    );
    let (_, v) = check_json(&world, &repo, "other.test");
    assert!(v.get("gate").is_none(), "{v}");
    // Gated but not allowed: refused like any other target, never "gated".
    world.write(world.home.join(".airlock/config.toml"), "[gate]\nhosts = [\"nowhere.test\"]\n");
    let (code, v) = check_json(&world, &repo, "nowhere.test");
    assert_eq!((code, v["reason"].as_str()), (1, Some("not_allowed")), "{v}");
    assert!(v.get("gate").is_none(), "{v}");
    let show = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    assert!(show.stdout().contains("  gates: nowhere.test (medium)"), "{}", show.stdout());

    world.write(world.home.join(".airlock/config.toml"), "[gate]\nhosts = [\"bad host\"]\n");
    let run = check(&world, &repo, "pay.test");
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("config.toml:2:10"), "{}", run.stderr());
    assert!(run.stderr().contains("gate.hosts entry \"bad host\""), "{}", run.stderr());
}
