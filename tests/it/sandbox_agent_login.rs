//! `airlock agent import-login` and `airlock policy init` against what an agent can leave
//! behind (issue 15, "Agents"). Runs as root and, through `.ci/unprivileged` (filter
//! `sandbox`), as an unprivileged user.
//!
//! - import-login copies the host's login (fake host logins in a World) into the shared store:
//!   only the credential format's fields, 0600, never through a symlink, never over an existing
//!   shared login without `--force`; the next `airlock run` starts signed in and sees nothing
//!   else of the host's `~/.claude`.
//! - policy init, in two steps: a session plants `.airlock.toml` as a symlink to a host file;
//!   the host's `policy init` then refuses (the name is taken) and, with `--force`, replaces
//!   the link instead of writing through it.
//!
//! Network safety: the stand-in agent opens no connection; the policy lists only
//! `example.test`, never dialed.
#![cfg_attr(not(feature = "test-hooks"), allow(dead_code, unused_imports))]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Run, World};

const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// A host login with fields that must not travel (`extra`, `mcpOAuth`).
const HOST_CLAUDE: &str = r#"{"claudeAiOauth":{"accessToken":"at-host","refreshToken":"rt-host","expiresAt":9,"scopes":["user:inference"],"extra":"x"},"mcpOAuth":{"srv":{"accessToken":"mcp-host"}}}"#;
const HOST_CODEX: &str = r#"{"OPENAI_API_KEY":null,"tokens":{"id_token":"id","access_token":"at-codex","refresh_token":"rt-codex","account_id":"acc"},"last_refresh":"2026-12-01T00:00:00Z","note":"host-only"}"#;

struct Host {
    world: World,
    fakebin: PathBuf,
}

impl Host {
    fn new() -> Self {
        let world = World::new();
        world.write(
            world.home.join(".airlock/config.toml"),
            "[network]\nallow = [\"example.test\"]\n",
        );
        let fakebin = world.tmp.path().join("fakebin");
        for agent in ["claude", "codex"] {
            world.write_executable(
                fakebin.join(agent),
                "#!/bin/sh\n# Stand-in agent: runs its first argument as a script.\nexec /bin/sh -c \"$1\"\n",
            );
        }
        Self { world, fakebin }
    }

    fn import(&self, args: &[&str]) -> Run {
        self.world.airlock(self.world.tmp.path()).args(["agent", "import-login"]).args(args).run()
    }

    fn shared(&self, agent: &str, file: &str) -> PathBuf {
        self.world.home.join(".airlock/agent").join(agent).join("shared").join(file)
    }

    #[cfg(feature = "test-hooks")]
    fn run_agent(&self, repo: &Path, agent: &str, script: &str) -> Run {
        self.world
            .airlock(repo)
            .env("PATH", format!("{}:{SYSTEM_PATH}", self.fakebin.display()))
            .args(["run", agent, "--", script])
            .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
            .run()
    }
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(feature = "test-hooks")]
#[test]
fn an_imported_claude_login_signs_in_every_repo_and_brings_nothing_else_of_the_host() {
    let h = Host::new();
    let host_cred = h.world.write(h.world.home.join(".claude/.credentials.json"), HOST_CLAUDE);
    // The rest of the host's ~/.claude is code-running configuration: it must stay out.
    h.world.write(
        h.world.home.join(".claude/settings.json"),
        r#"{"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"touch /tmp/pwned"}]}]}}"#,
    );
    let run = h.import(&["claude"]).expect_code(0);
    let shared = h.shared("claude", ".credentials.json");
    assert!(run.stdout().contains(&shared.display().to_string()), "{}", run.stdout());
    assert_eq!(mode(&shared), 0o600);
    let v = json_file(&shared);
    assert_eq!(v["claudeAiOauth"]["accessToken"], "at-host");
    assert!(v.get("mcpOAuth").is_none() && v["claudeAiOauth"].get("extra").is_none(), "{v}");
    // The host's file is read, not moved or changed.
    assert_eq!(std::fs::read_to_string(&host_cred).unwrap(), HOST_CLAUDE);

    for name in ["app", "lib"] {
        let repo = h.world.repo(name);
        let out = h
            .run_agent(&repo, "claude", "cat ~/.claude/.credentials.json; echo; ls -A ~/.claude")
            .expect_code(0)
            .stdout();
        let mut lines = out.lines();
        let inside: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(inside["claudeAiOauth"]["accessToken"], "at-host", "{name}: {out}");
        let listed: Vec<&str> = lines.collect();
        assert_eq!(listed, [".credentials.json"], "{name}: the host's ~/.claude leaked in: {out}");
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn an_imported_codex_login_from_codex_home_reaches_the_session() {
    let h = Host::new();
    let codex_home = h.world.tmp.path().join("codex-home");
    h.world.write(codex_home.join("auth.json"), HOST_CODEX);
    h.world
        .airlock(h.world.tmp.path())
        .env("CODEX_HOME", &codex_home)
        .args(["agent", "import-login", "codex"])
        .run()
        .expect_code(0);
    let shared = h.shared("codex", "auth.json");
    assert_eq!(mode(&shared), 0o600);
    let v = json_file(&shared);
    assert_eq!(v["tokens"]["access_token"], "at-codex");
    assert_eq!(v["last_refresh"], "2026-12-01T00:00:00Z");
    assert!(v.get("note").is_none(), "{v}");
    let repo = h.world.repo("cdx");
    let out = h.run_agent(&repo, "codex", "cat ~/.codex/auth.json").expect_code(0).stdout();
    let inside: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(inside["tokens"]["refresh_token"], "rt-codex", "{out}");
}

#[test]
fn import_login_refuses_an_existing_shared_login_unless_forced() {
    let h = Host::new();
    h.world.write(h.world.home.join(".claude/.credentials.json"), HOST_CLAUDE);
    let held = r#"{"claudeAiOauth":{"accessToken":"signed-in-inside"}}"#;
    let shared = h.world.write(h.shared("claude", ".credentials.json"), held);
    let run = h.import(&["claude"]).expect_code(1);
    assert!(run.stderr().contains("already holds a shared claude login"), "{}", run.stderr());
    assert!(run.stderr().contains("--force"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(&shared).unwrap(), held);
    h.import(&["claude", "--force"]).expect_code(0);
    assert_eq!(json_file(&shared)["claudeAiOauth"]["accessToken"], "at-host");
    assert_eq!(mode(&shared), 0o600);
}

#[test]
fn import_login_never_follows_a_symlink_and_says_what_to_do() {
    let h = Host::new();
    // A valid login elsewhere: following the link would pass the format check, so only not
    // following it keeps it out.
    let elsewhere = h.world.write(h.world.tmp.path().join("elsewhere/creds.json"), HOST_CLAUDE);
    std::fs::create_dir_all(h.world.home.join(".claude")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, h.world.home.join(".claude/.credentials.json")).unwrap();
    let run = h.import(&["claude"]).expect_code(1);
    assert!(run.stderr().contains("is a symlink"), "{}", run.stderr());
    assert!(!h.shared("claude", ".credentials.json").exists());
    // The real file, named with --from, imports.
    h.import(&["claude", "--from", elsewhere.to_str().unwrap()]).expect_code(0);
    assert_eq!(
        json_file(&h.shared("claude", ".credentials.json"))["claudeAiOauth"]["accessToken"],
        "at-host"
    );

    // A directory on the way that is a link (a dotfiles manager's ~/.codex) is refused too.
    let real_dir = h.world.tmp.path().join("dotfiles/codex");
    h.world.write(real_dir.join("auth.json"), HOST_CODEX);
    std::os::unix::fs::symlink(&real_dir, h.world.home.join(".codex")).unwrap();
    let run = h.import(&["codex"]).expect_code(1);
    assert!(run.stderr().contains(".codex is a symlink"), "{}", run.stderr());
    assert!(!h.shared("codex", "auth.json").exists());
}

#[test]
fn import_login_without_a_host_login_or_with_a_broken_one_writes_nothing() {
    let h = Host::new();
    let run = h.import(&["claude"]).expect_code(1);
    assert!(run.stderr().contains("no login at"), "{}", run.stderr());
    assert!(run.stderr().contains(".claude"), "{}", run.stderr());
    h.world.write(h.world.home.join(".codex/auth.json"), r#"{"not":"a login"}"#);
    let run = h.import(&["codex"]).expect_code(1);
    assert!(run.stderr().contains("does not parse as"), "{}", run.stderr());
    assert!(!h.world.home.join(".airlock/agent").exists());
    let run = h.import(&["gemini"]).expect_code(2);
    assert!(run.stderr().contains("claude") && run.stderr().contains("codex"), "{}", run.stderr());
}

/// Step 1: a session leaves `.airlock.toml` as a symlink to a host file. Step 2: the host's
/// `airlock policy init` must neither take the name as free nor write through the link.
#[cfg(feature = "test-hooks")]
#[test]
fn policy_init_never_writes_through_a_link_a_session_planted() {
    let h = Host::new();
    let repo = h.world.repo("app");
    let victim = h.world.write(h.world.home.join(".bashrc"), "# the user's own\n");
    let script = format!("ln -s {} .airlock.toml && echo planted", victim.display());
    let out = h.run_agent(&repo, "claude", &script).expect_code(0).stdout();
    assert!(out.contains("planted"), "{out}");
    let planted = repo.join(".airlock.toml");
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    // The end-of-session sweep takes such a link out of the repo (into quarantine); a clone or
    // a checkout can still carry one, so it is planted again from the host side for step 2.
    if !is_link(&planted) {
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
    }

    let run =
        h.world.airlock(&repo).args(["policy", "init", "--agent", "claude"]).run().expect_code(3);
    assert!(run.stderr().contains("already exists"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "# the user's own\n");

    h.world
        .airlock(&repo)
        .args(["policy", "init", "--agent", "claude", "--force"])
        .run()
        .expect_code(0);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "# the user's own\n");
    assert!(!is_link(&planted), "the link is still there");
    assert!(std::fs::read_to_string(&planted).unwrap().contains("=api.anthropic.com:443"));
}
