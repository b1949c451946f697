//! `airlock policy init --agent claude|codex`: the starting file parses with the real config
//! parser (the binary's own `policy check`/`policy show` read it), lists the agent's hosts, and
//! an existing file is never overwritten without `--force`. `policy check` is pure: nothing
//! here resolves a name or opens a socket.

use std::path::Path;

use crate::support::{Run, World};

fn check(world: &World, repo: &Path, target: &str) -> Run {
    world.airlock(repo).args(["policy", "check", target]).run()
}

#[test]
fn repo_file_for_claude_parses_and_allows_exactly_its_hosts_once_trusted() {
    let world = World::new();
    let repo = world.repo("app");
    let run =
        world.airlock(&repo).args(["policy", "init", "--agent", "claude"]).run().expect_code(0);
    let file = std::fs::canonicalize(&repo).unwrap().join(".airlock.toml");
    assert!(run.stdout().contains(&format!("wrote {}", file.display())), "{}", run.stdout());
    assert!(run.stdout().contains("airlock policy trust"), "{}", run.stdout());
    let text = std::fs::read_to_string(&file).unwrap();
    // Commented: each host says why; telemetry is listed but left out.
    assert!(text.lines().filter(|l| l.trim_start().starts_with('#')).count() > 10, "{text}");
    assert!(text.contains("# \"=statsig.anthropic.com:443\""), "{text}");
    assert!(text.contains("# \"sentry.io:443\""), "{text}");

    // Untrusted, it does not apply (nothing else allows anything: an empty allowlist).
    let run = check(&world, &repo, "api.anthropic.com").expect_code(3);
    assert!(run.stderr().contains("is not trusted"), "{}", run.stderr());
    world.airlock(&repo).args(["policy", "trust"]).run().expect_code(0);
    for host in ["api.anthropic.com", "platform.claude.com", "console.anthropic.com", "claude.ai"] {
        let run = check(&world, &repo, host).expect_code(0);
        assert!(run.stdout().contains("(repo layer"), "{host}: {}", run.stdout());
    }
    for host in [
        "statsig.anthropic.com",
        "sentry.io",
        "api.anthropic.com:80",
        "x.api.anthropic.com",
        "chatgpt.com",
    ] {
        check(&world, &repo, host).expect_code(1);
    }
    let show = world.airlock(&repo).args(["policy", "show"]).run().expect_code(0);
    assert!(!show.stderr().contains("warning"), "{}", show.stderr());
}

#[test]
fn user_layer_for_both_agents_applies_without_trust() {
    let world = World::new();
    let repo = world.repo("app");
    world
        .airlock(&repo)
        .args(["policy", "init", "--agent", "codex", "--agent", "claude", "--layer", "user"])
        .run()
        .expect_code(0);
    let file = world.home.join(".airlock/config.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("# --- Codex ---") && text.contains("# --- Claude Code ---"), "{text}");
    for host in ["chatgpt.com", "auth.openai.com", "api.openai.com", "api.anthropic.com"] {
        let run = check(&world, &repo, host).expect_code(0);
        assert!(run.stdout().contains("(user layer"), "{host}: {}", run.stdout());
    }
    check(&world, &repo, "api.github.com").expect_code(1);
    assert!(!repo.join(".airlock.toml").exists());
}

#[test]
fn an_existing_file_is_kept_unless_forced() {
    let world = World::new();
    let repo = world.repo("app");
    let mine = "[network]\nallow = [\"example.test\"] # mine\n";
    let file = world.write(repo.join(".airlock.toml"), mine);
    let run =
        world.airlock(&repo).args(["policy", "init", "--agent", "codex"]).run().expect_code(3);
    assert!(run.stderr().contains("already exists"), "{}", run.stderr());
    assert!(run.stderr().contains("--force"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);

    world.write(world.home.join(".airlock/config.toml"), mine);
    world
        .airlock(&repo)
        .args(["policy", "init", "--agent", "codex", "--layer", "user"])
        .run()
        .expect_code(3);
    assert_eq!(std::fs::read_to_string(world.home.join(".airlock/config.toml")).unwrap(), mine);

    world
        .airlock(&repo)
        .args(["policy", "init", "--agent", "codex", "--force"])
        .run()
        .expect_code(0);
    assert!(std::fs::read_to_string(&file).unwrap().contains("=chatgpt.com:443"));
    // An agent name it does not know is a usage error listing the ones it does.
    let run =
        world.airlock(&repo).args(["policy", "init", "--agent", "gemini"]).run().expect_code(2);
    assert!(run.stderr().contains("claude") && run.stderr().contains("codex"), "{}", run.stderr());
}
