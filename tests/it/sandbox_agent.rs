//! `airlock run`: agents in the sandbox (issue 6; SECURITY §4 agent home, §5, §6; DESIGN §5,
//! §7). The agent-home classes are attempted for real by a stand-in `claude` (a shell script
//! found on PATH, so it gets Claude Code's home layout) that runs whatever the test tells it
//! to inside; a real Claude Code from the npm registry shows the whole path end to end. Runs as
//! root and, through `.ci/unprivileged` (filter `sandbox`), as an unprivileged user.
//!
//! Network safety: no policy here lists an Anthropic host, so the proxy refuses it without
//! resolving it; the only allowed name, `example.test`, is never dialed.
// Without `test-hooks` only the tests needing no hook are built; helpers the others share
// are then unused.
#![cfg_attr(not(feature = "test-hooks"), allow(dead_code, unused_imports))]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::harness::{Harness, Options};
use crate::support::{self, Run, TestCommand, World, wait_until};

const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const CRED_V1: &str =
    r#"{"claudeAiOauth":{"accessToken":"at-v1","refreshToken":"rt-v1","expiresAt":1}}"#;
const CRED_V2: &str =
    r#"{"claudeAiOauth":{"accessToken":"at-v2","refreshToken":"rt-v2","expiresAt":2}}"#;

/// A user with a stand-in `claude` on PATH and a user policy allowing one test name.
struct Agents {
    world: World,
    fakebin: PathBuf,
}

impl Agents {
    fn new() -> Self {
        let world = World::new();
        world.write(
            world.home.join(".airlock/config.toml"),
            "[network]\nallow = [\"example.test\"]\n",
        );
        // Where the native installer puts it (`~/.local/bin`): a tree under the home, so the
        // sandbox shows it relocated below /opt/airlock/agents (docs/agents.md).
        let fakebin = world.home.join(".local/bin");
        world.write_executable(
            fakebin.join("claude"),
            "#!/bin/sh\n# Stand-in for Claude Code: runs its first argument as a script.\nexec /bin/sh -c \"$1\"\n",
        );
        Self { world, fakebin }
    }

    fn repo(&self, name: &str) -> PathBuf {
        self.world.repo(name)
    }

    fn path(&self) -> String {
        format!("{}:{SYSTEM_PATH}", self.fakebin.display())
    }

    /// `airlock run claude -- SCRIPT` in `repo`, with the test bridge holding the listener.
    #[cfg(feature = "test-hooks")]
    fn run(&self, repo: &Path, script: &str) -> Run {
        self.cmd(repo, script).hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold").run()
    }

    fn cmd(&self, repo: &Path, script: &str) -> TestCommand {
        self.world.airlock(repo).env("PATH", self.path()).args(["run", "claude", "--", script])
    }

    fn agent_dir(&self) -> PathBuf {
        self.world.home.join(".airlock/agent/claude")
    }

    /// The host directory of `repo`'s Claude home (`<name>-<8 hex>`).
    fn home_of(&self, repo: &Path) -> PathBuf {
        let canonical = std::fs::canonicalize(repo).unwrap();
        let digest = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
        let name = repo.file_name().unwrap().to_string_lossy().to_lowercase();
        self.agent_dir().join(format!("{name}-{}", &digest[..8]))
    }

    fn shared_credential(&self) -> PathBuf {
        self.agent_dir().join("shared/.credentials.json")
    }

    /// A file on the host the agent must never see or change (stands for `~/.ssh/id_rsa`).
    fn host_secret(&self) -> PathBuf {
        let p = self.world.write(self.world.home.join(".ssh/id_rsa"), "HOST-SECRET\n");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    /// The user's real Claude credential on the host (a valid one: following a link to it
    /// would pass the format check, so only not following it keeps it out).
    fn host_credential(&self) -> PathBuf {
        self.world.write(self.world.home.join(".claude/.credentials.json"), CRED_V2)
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn sha256_file(path: &Path) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(std::fs::read(path).unwrap())))
}

#[cfg(feature = "test-hooks")]
#[test]
fn the_agent_home_persists_per_repo_at_home_agent() {
    let a = Agents::new();
    let repo = a.repo("alpha");
    a.world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let run = a
        .run(
            &repo,
            "echo \"home=$HOME pwd=$(pwd) claude=$(command -v claude)\"; \
             test -d /home/agent/.claude && echo has-claude-dir; \
             echo one > ~/.claude/marker; git config --global user.email; \
             mv ~/.claude/marker ~/.claude/marker2 && mv ~/.claude/marker2 ~/.claude/marker && echo renamed",
        )
        .expect_code(0);
    let out = run.stdout();
    assert!(out.contains("home=/home/agent pwd=/alpha claude=/opt/airlock/bin/claude"), "{out}");
    assert!(out.contains("has-claude-dir\n"), "{out}");
    assert!(out.contains("dev@example.test\n"), "the synthesized .gitconfig: {out}");
    assert!(out.contains("renamed\n"), "atomic renames work in the home: {out}");
    let home = a.home_of(&repo);
    assert_eq!(std::fs::read_to_string(home.join(".claude/marker")).unwrap(), "one\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the home is private");
    // The next session of the same repo finds it.
    let run = a.run(&repo, "cat ~/.claude/marker").expect_code(0);
    assert_eq!(run.stdout(), "one\n");
    // The home is claimed by its repo (beside it, out of the agent's reach): another repo whose
    // key collides is refused rather than handed this home.
    let marker =
        home.with_file_name(format!("{}.repo", home.file_name().unwrap().to_string_lossy()));
    let owner = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(owner.trim_end(), std::fs::canonicalize(&repo).unwrap().to_string_lossy());
    std::fs::write(&marker, "/somewhere/else/alpha\n").unwrap();
    let run = a.run(&repo, "echo started").expect_code(125);
    assert!(run.stderr().contains("belongs to the repo /somewhere/else/alpha"), "{}", run.stderr());
    assert!(run.stdout().is_empty());
}

#[cfg(feature = "test-hooks")]
#[test]
fn repo_a_cannot_read_repo_b_transcripts_or_plant_what_b_loads() {
    let a = Agents::new();
    let repo_a = a.repo("alpha");
    let repo_b = a.repo("beta");
    let home_b = a.home_of(&repo_b);
    // B has a transcript of its own.
    a.run(
        &repo_b,
        "mkdir -p ~/.claude/projects/-beta && echo '{\"secret\":\"B-TRANSCRIPT\"}' > ~/.claude/projects/-beta/s.jsonl",
    )
    .expect_code(0);
    // A tries to read B's home by every path it might know, and plants settings, hooks, memory
    // and MCP config in its own home and wherever B's might be.
    // B's home lives under /var/tmp (support::world_parent), which only the mount plan hides;
    // every attempt's error is printed and the whole output compared exactly.
    let plant = format!(
        "cat {b}/.claude/projects/-beta/s.jsonl 2>&1 && echo READ-B; \
         ls /home 2>&1; grep -rs B-TRANSCRIPT /home /opt /tmp; echo grep=$?; \
         mkdir -p ~/.claude/commands ~/.claude/agents; \
         echo '{{\"hooks\":{{\"SessionStart\":[{{\"hooks\":[{{\"type\":\"command\",\"command\":\"touch /tmp/pwned\"}}]}}]}}}}' > ~/.claude/settings.json; \
         echo 'A-MEMORY' > ~/.claude/CLAUDE.md; echo '{{\"mcpServers\":{{\"evil\":{{\"command\":\"sh\"}}}}}}' > ~/.claude.json; \
         echo x > ~/.claude/commands/evil.md; echo x > ~/.claude/agents/evil.md; \
         mkdir -p {b}/.claude 2>/dev/null && echo A-MEMORY > {b}/.claude/CLAUDE.md && echo PLANTED-B; \
         echo mkdir=$?; \
         echo done",
        b = home_b.display()
    );
    let run = a.run(&repo_a, &plant).expect_code(0);
    let out = run.stdout();
    let expected = format!(
        "cat: {b}/.claude/projects/-beta/s.jsonl: No such file or directory\n\
         agent\n\
         grep=1\n\
         mkdir=1\n\
         done\n",
        b = home_b.display()
    );
    assert_eq!(out, expected, "stderr:\n{}", run.stderr());
    // B's next session sees only B's files.
    let run = a.run(&repo_b, "cd ~ && find . -type f | sort").expect_code(0);
    let files = run.stdout();
    assert!(files.contains("./.claude/projects/-beta/s.jsonl"), "{files}");
    for planted in ["settings.json", "CLAUDE.md", ".claude.json", "evil.md"] {
        assert!(!files.contains(planted), "{planted} reached B: {files}");
    }
    assert!(!home_b.join(".claude/CLAUDE.md").exists());
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_refreshed_credential_is_shared_with_the_next_repos_session() {
    let a = Agents::new();
    a.world.write(a.shared_credential(), CRED_V1);
    let repo_a = a.repo("alpha");
    let repo_b = a.repo("beta");
    let refresh = format!(
        "cat ~/.claude/.credentials.json; echo; printf '%s' '{CRED_V2}' > ~/.claude/.credentials.json.tmp \
         && mv ~/.claude/.credentials.json.tmp ~/.claude/.credentials.json; \
         echo '{{\"theme\":\"dark\"}}' > ~/.claude/settings.json"
    );
    let run = a.run(&repo_a, &refresh).expect_code(0);
    assert!(run.stdout().starts_with(CRED_V1), "copied in before start: {}", run.stdout());
    assert_eq!(json(&std::fs::read_to_string(a.shared_credential()).unwrap()), json(CRED_V2));
    // Only the credential is shared: nothing else lands in the shared store.
    let shared: Vec<_> = std::fs::read_dir(a.agent_dir().join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(shared, vec![".credentials.json".to_string()]);
    // B starts with the refreshed one; a file that is not a credential is not taken back.
    let run = a
        .run(&repo_b, "cat ~/.claude/.credentials.json; echo '{\"not\":\"a credential\"}' > ~/.claude/.credentials.json")
        .expect_code(0);
    assert_eq!(json(&run.stdout()), json(CRED_V2));
    assert!(run.stderr().contains("not sharing"), "{}", run.stderr());
    assert_eq!(json(&std::fs::read_to_string(a.shared_credential()).unwrap()), json(CRED_V2));
    assert!(!a.home_of(&repo_b).join(".claude/settings.json").exists());
}

#[cfg(feature = "test-hooks")]
#[test]
fn symlinks_planted_in_the_home_are_never_followed_by_copy_in_or_copy_back() {
    let a = Agents::new();
    let secret = a.host_secret();
    let host_cred = a.host_credential();
    a.world.write(a.shared_credential(), CRED_V1);
    let repo = a.repo("alpha");
    // The agent cannot read the host files themselves, but it can name them in symlinks.
    let plant = format!(
        "cat {s} {c} 2>/dev/null && echo READ-SECRET; \
         ln -sf {c} ~/.claude/.credentials.json && ln -s {s} ~/.claude.json && echo planted",
        s = secret.display(),
        c = host_cred.display()
    );
    let run = a.run(&repo, &plant).expect_code(0);
    assert!(!run.stdout().contains("READ-SECRET"), "{}", run.stdout());
    assert!(run.stdout().contains("planted"), "{}", run.stdout());
    // Copy-back did not follow the link (the host credential would have parsed): the shared
    // credential is untouched.
    assert_eq!(std::fs::read_to_string(a.shared_credential()).unwrap(), CRED_V1);
    assert!(
        run.stderr().contains("not sharing") && run.stderr().contains("symlink"),
        "{}",
        run.stderr()
    );
    // Copy-in replaces the link instead of writing through it.
    let run = a
        .run(
            &repo,
            "cat ~/.claude/.credentials.json; if test -L ~/.claude/.credentials.json; then echo LINK; fi",
        )
        .expect_code(0);
    assert_eq!(run.stdout(), CRED_V1);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "HOST-SECRET\n");
    assert_eq!(std::fs::read_to_string(&host_cred).unwrap(), CRED_V2);
    // A symlink where a whole directory of the layout belongs is refused outright.
    let home = a.home_of(&repo);
    std::fs::rename(home.join(".claude"), home.join("claude-old")).unwrap();
    std::os::unix::fs::symlink(secret.parent().unwrap(), home.join(".claude")).unwrap();
    let run = a.run(&repo, "echo started").expect_code(125);
    assert!(run.stderr().contains("symlink"), "{}", run.stderr());
    assert!(!run.stdout().contains("started"));
    let names: Vec<_> = std::fs::read_dir(secret.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "nothing was written into the link's target: {names:?}");
}

#[test]
fn session_records_carry_the_agent_and_hash_the_transcripts_it_changed() {
    let a = Agents::new();
    let secret = a.host_secret();
    // A transcript-shaped file beside it: following `linkdir` would hash it.
    a.world.write(secret.parent().unwrap().join("host.jsonl"), "{}\n");
    let repo = a.repo("records");
    a.world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(&a.world, Options::default());
    let session = |script: &str| a.cmd(&repo, script).env("AIRLOCK_SOCKET", h.socket()).run();
    session(
        "mkdir -p ~/.claude/projects/-records && cd ~/.claude/projects/-records && \
         echo '{\"n\":1}' > old.jsonl && echo '{\"n\":1}' > kept.jsonl",
    )
    .expect_code(0);
    let plant = format!(
        "cd ~/.claude/projects/-records && echo '{{\"n\":2}}' >> old.jsonl && echo '{{\"n\":1}}' > new.jsonl && \
         echo notes > notes.txt && ln -s {s} evil.jsonl && ln -s {d} linkdir && exit 3",
        s = secret.display(),
        d = secret.parent().unwrap().display()
    );
    session(&plant).expect_code(3);
    let recs = a.world.session_records("records");
    assert_eq!(recs.len(), 4, "{recs:?}");
    let (start, end) = (&recs[2], &recs[3]);
    let id = start["session"].as_str().unwrap();
    assert_eq!(start["id"], format!("{id}:start"));
    assert_eq!(end["id"], format!("{id}:end"));
    assert_eq!(start["agent"], "claude");
    assert!(start["user_id"].as_str().unwrap().starts_with("u_"), "{start}");
    assert!(start["policy_digest"].as_str().unwrap().starts_with("sha256:"));
    assert!(start["layers"].as_array().unwrap().iter().any(|l| l == "seccomp"), "{start}");
    assert_eq!(end["exit_status"], 3);
    let dir = a.home_of(&repo).join(".claude/projects/-records");
    // Each entry: host path, path relative to the agent home, the prefix's size and hash.
    let hashed: Vec<(String, String, u64, String)> = end["transcripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["path"].as_str().unwrap().to_string(),
                t["file"].as_str().unwrap().to_string(),
                t["bytes"].as_u64().unwrap(),
                t["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expect: Vec<(String, String, u64, String)> = ["new.jsonl", "old.jsonl"]
        .iter()
        .map(|f| {
            let p = dir.join(f);
            let size = std::fs::metadata(&p).unwrap().len();
            let rel = format!(".claude/projects/-records/{f}");
            (p.display().to_string(), rel, size, sha256_file(&p))
        })
        .collect();
    assert_eq!(hashed, expect, "only the changed transcripts, hashed; links not followed: {end}");
    // The first session's end record hashed the two files it created.
    assert_eq!(recs[1]["transcripts"].as_array().unwrap().len(), 2, "{}", recs[1]);
}

#[test]
fn killing_the_supervisor_records_supervisor_lost() {
    let a = Agents::new();
    let repo = a.repo("lost");
    let h = Harness::start(&a.world, Options::default());
    let mut cmd = a.cmd(&repo, "echo started; sleep 60").env("AIRLOCK_SOCKET", h.socket()).cmd;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(wait_until(Duration::from_secs(20), || a.world.session_records("lost").len() == 2));
    let recs = a.world.session_records("lost");
    assert_eq!(recs[0]["agent"], "claude");
    assert_eq!(recs[1]["end_reason"], "supervisor_lost", "{recs:?}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn piped_input_reaches_the_agent() {
    let a = Agents::new();
    let repo = a.repo("piped");
    let mut cmd = a.cmd(&repo, "tr a-z A-Z").hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold").cmd;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"a prompt\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "A PROMPT\n");
    assert!(out.status.success());
}

#[test]
fn a_missing_agent_exits_127_and_says_how_to_install_it() {
    let a = Agents::new();
    let repo = a.repo("missing");
    let run = a
        .world
        .airlock(&repo)
        .env("PATH", SYSTEM_PATH)
        .args(["run", "codex"])
        .run()
        .expect_code(127);
    assert!(run.stderr().contains("npm install -g @openai/codex"), "{}", run.stderr());
    let run =
        a.world.airlock(&repo).env("PATH", "/nonexistent").args(["run"]).run().expect_code(127);
    assert!(run.stderr().contains("npm install -g @anthropic-ai/claude-code"), "{}", run.stderr());
    let run = a.world.airlock(&repo).args(["run", "./nope"]).run().expect_code(127);
    assert!(run.stderr().contains("nope"), "{}", run.stderr());
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_path_agent_runs_with_its_own_home() {
    let a = Agents::new();
    let repo = a.repo("custom");
    a.world.write_executable(
        repo.join("tools/my-agent"),
        "#!/bin/sh\necho \"custom $HOME $*\"; ls -a ~\n",
    );
    let run = a
        .world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["run", "./tools/my-agent", "--", "x", "y"])
        .run()
        .expect_code(0);
    assert!(run.stdout().starts_with("custom /home/agent x y\n"), "{}", run.stdout());
    assert!(a.world.home.join(".airlock/agent/custom-my-agent").is_dir());
}

/// Regression (review of issue 6): a repo's own `./claude` was a custom agent named `claude`
/// and shared Claude Code's homes, credentials included.
#[cfg(feature = "test-hooks")]
#[test]
fn a_repo_script_named_claude_never_gets_claudes_credentials() {
    let a = Agents::new();
    a.world.write(a.shared_credential(), CRED_V1);
    let repo = a.repo("impostor");
    a.world.write_executable(
        repo.join("claude"),
        "#!/bin/sh\ncat ~/.claude/.credentials.json 2>/dev/null && echo GOT-CREDENTIAL; echo \"$HOME\"\n",
    );
    let run = a
        .world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["run", "./claude"])
        .run()
        .expect_code(0);
    assert!(!run.stdout().contains("GOT-CREDENTIAL"), "{}", run.stdout());
    assert!(a.world.home.join(".airlock/agent/custom-claude").is_dir());
    // A repo script that links out of the repo is refused before anything runs.
    std::os::unix::fs::symlink(a.fakebin.join("claude"), repo.join("linked")).unwrap();
    let run = a
        .world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["run", "./linked"])
        .run()
        .expect_code(125);
    assert!(run.stderr().contains("outside it"), "{}", run.stderr());
}

// ---- A real Claude Code from the npm registry ----

/// Claude Code's version the suite installs (override: `AIRLOCK_TEST_CLAUDE_VERSION`).
const CLAUDE_VERSION: &str = "2.1.197";

fn claude_version() -> String {
    std::env::var("AIRLOCK_TEST_CLAUDE_VERSION").unwrap_or_else(|_| CLAUDE_VERSION.to_string())
}

/// Installs Claude Code from the npm registry once per user and run, into a directory under
/// the temp dir (so it is relocated to `/opt/airlock/agents/claude/` inside), and returns its
/// `node_modules/.bin`. None (a loud skip) without npm outside CI; in CI a failure.
fn claude_code() -> Option<PathBuf> {
    static INSTALLED: OnceLock<Option<PathBuf>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let version = claude_version();
            let npm =
                ["/usr/bin/npm", "/usr/local/bin/npm"].into_iter().find(|p| Path::new(p).exists());
            let Some(npm) = npm else {
                assert!(!support::in_ci(), "npm is missing; CI must install it (.ci/prereqs)");
                eprintln!("SKIP: npm not installed");
                return None;
            };
            let uid = nix::unistd::getuid().as_raw();
            let prefix = std::env::temp_dir().join(format!("airlock-test-claude-{uid}-{version}"));
            let bin = prefix.join("node_modules/.bin");
            if bin.join("claude").exists() {
                return Some(bin);
            }
            let staging = std::env::temp_dir()
                .join(format!("airlock-test-claude-{uid}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging).unwrap();
            // A project of its own in the staging dir (not `--prefix`, which would also move
            // npm's global config, and with it a machine's registry CA setting).
            std::fs::write(staging.join("package.json"), "{\"private\": true}\n").unwrap();
            let out = Command::new(npm)
                .current_dir(&staging)
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .arg(format!("@anthropic-ai/claude-code@{version}"))
                .env("npm_config_cache", staging.join(".npm-cache"))
                .env("npm_config_update_notifier", "false")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "npm install @anthropic-ai/claude-code@{version} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = std::fs::remove_dir_all(staging.join(".npm-cache"));
            // Another process may have finished first; either copy is complete.
            if std::fs::rename(&staging, &prefix).is_err() {
                let _ = std::fs::remove_dir_all(&staging);
            }
            assert!(
                bin.join("claude").exists(),
                "npm left no node_modules/.bin/claude in {}",
                prefix.display()
            );
            Some(bin)
        })
        .clone()
}

/// A user policy that passes a dummy API key through `[env] pass` and lists no Anthropic
/// host (so the proxy refuses it without resolving it).
const API_KEY_POLICY: &str =
    "[network]\nallow = [\"example.test\"]\n\n[env]\npass = [\"ANTHROPIC_API_KEY\"]\n";

/// `airlock run claude -- ARGS` with the installed Claude Code, `h`'s daemon, a dummy key.
fn real_claude(a: &Agents, bin: &Path, repo: &Path, h: &Harness, args: &[&str]) -> Command {
    a.world
        .airlock(repo)
        .env("PATH", format!("{}:{SYSTEM_PATH}", bin.display()))
        .env("AIRLOCK_SOCKET", h.socket())
        .env("ANTHROPIC_API_KEY", "sk-ant-test-dummy-key")
        .args(["run", "claude", "--"])
        .args(args)
        .cmd
}

/// Waits for `child`; if Claude is still retrying after 240 s, ends it as a user would
/// (Ctrl-C), and failing that kills it, so the suite never hangs.
fn finish(mut child: std::process::Child) -> std::process::Output {
    let signal = |child: &std::process::Child, sig| {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
    };
    if !wait_until(Duration::from_secs(240), || child.try_wait().unwrap().is_some()) {
        signal(&child, nix::sys::signal::Signal::SIGINT);
        if !wait_until(Duration::from_secs(10), || child.try_wait().unwrap().is_some()) {
            signal(&child, nix::sys::signal::Signal::SIGKILL);
        }
    }
    child.wait_with_output().unwrap()
}

/// Whether the repo's audit log holds a refusal of the Anthropic API host.
fn refused_anthropic(world: &World, repo: &str) -> bool {
    world
        .audit_lines(repo)
        .iter()
        .any(|l| l["host"] == "api.anthropic.com" && l["allowed"] == false)
}

#[cfg(feature = "test-hooks")]
#[test]
fn real_claude_code_prints_its_version_inside_the_sandbox() {
    let Some(bin) = claude_code() else { return };
    let a = Agents::new();
    let repo = a.repo("version");
    let run = a
        .world
        .airlock(&repo)
        .env("PATH", format!("{}:{SYSTEM_PATH}", bin.display()))
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["run", "claude", "--", "--version"])
        .run()
        .expect_code(0);
    assert!(run.stdout().contains("(Claude Code)"), "{}\n{}", run.stdout(), run.stderr());
}

#[test]
fn real_claude_code_prompt_is_refused_audited_and_recorded() {
    let Some(bin) = claude_code() else { return };
    let a = Agents::new();
    let repo = a.repo("hello");
    a.world.write(a.world.home.join(".airlock/config.toml"), API_KEY_POLICY);
    a.world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(&a.world, Options::default());
    let mut cmd = real_claude(&a, &bin, &repo, &h, &["-p", "hello"]);
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let out = finish(child);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        refused_anthropic(&a.world, "hello"),
        "no refused line for api.anthropic.com\n--- stderr\n{stderr}\n--- daemon\n{}",
        h.log()
    );
    let user_id = std::fs::read_to_string(a.world.home.join(".airlock/identity.toml")).unwrap();
    let lines = a.world.audit_lines("hello");
    let line = lines.iter().find(|l| l["host"] == "api.anthropic.com").unwrap();
    assert!(user_id.contains(line["user_id"].as_str().unwrap()), "{line}");
    assert_eq!(line["repo"], "hello");
    assert!(wait_until(Duration::from_secs(20), || a.world.session_records("hello").len() == 2));
    let recs = a.world.session_records("hello");
    assert_eq!(recs[0]["agent"], "claude");
    assert_eq!(recs[0]["agent_version"], claude_version().as_str());
    assert_eq!(recs[0]["command"][1], "-p");
    let transcripts = recs[1]["transcripts"].as_array().unwrap();
    assert!(!transcripts.is_empty(), "Claude's transcript is hashed: {}\n{stderr}", recs[1]);
    for t in transcripts {
        let path = PathBuf::from(t["path"].as_str().unwrap());
        assert!(path.starts_with(a.home_of(&repo).join(".claude/projects")), "{t}");
        assert_eq!(t["sha256"].as_str().unwrap(), sha256_file(&path));
    }
}

/// Drives `airlock ARGS` on a pseudo-terminal (rows×cols 40×120) with python's `pty`: prints
/// everything the agent drew, then `EXIT <status>`. `steps` is python run after the first
/// output arrives, with `send(bytes)`, `resize(rows, cols)` and `pump(seconds)` in scope.
fn on_a_terminal(
    a: &Agents,
    repo: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    args: &[&str],
    steps: &str,
) -> String {
    let script = format!(
        r#"
import os, pty, sys, time, select, signal, struct, fcntl, termios
argv = sys.argv[1:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
out = b""
def pump(secs, until=None):
    global out
    end = time.time() + secs
    while time.time() < end:
        if until is not None and until in out:
            return
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                return
            if not d:
                return
            out += d
def send(b):
    os.write(fd, b)
def resize(rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.kill(pid, signal.SIGWINCH)
pump(60, until=b"\n")
{steps}
pump(60)
deadline = time.time() + 30
done, status = os.waitpid(pid, os.WNOHANG)
while done == 0 and time.time() < deadline:
    time.sleep(0.05)
    done, status = os.waitpid(pid, os.WNOHANG)
if done == 0:
    # Never hang the suite: the supervisor's death takes the whole sandbox with it.
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    out += b"\nTIMEOUT"
sys.stdout.write(out.decode("utf-8", "replace"))
print("\nEXIT", os.waitstatus_to_exitcode(status))
"#
    );
    let out = Command::new("python3")
        .current_dir(repo)
        .env_clear()
        .env("HOME", &a.world.home)
        .env("TERM", "xterm-256color")
        .env("AIRLOCK_TEST_MANAGED_POLICY", &a.world.managed)
        .envs(env.iter().copied())
        .arg("-c")
        .arg(script)
        .arg(support::bin("airlock"))
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[cfg(feature = "test-hooks")]
#[test]
fn on_a_terminal_the_agent_gets_a_pty_that_resizes_and_takes_ctrl_c() {
    if !support::have("python3") {
        return;
    }
    let a = Agents::new();
    let repo = a.repo("tty");
    let agent = "trap 'echo got-ctrl-c; exit 7' INT; echo ready; stty size; read line; \
                 stty size; while :; do sleep 0.1; done";
    let steps = r#"
pump(10, until=b"40 120")
resize(30, 100)
pump(0.5)
send(b"\n")
pump(5, until=b"30 100")
send(b"\x03")
"#;
    let path = a.path();
    let env = [("PATH", path.as_ref()), ("AIRLOCK_TEST_PROXY_BRIDGE", "hold".as_ref())];
    let out = on_a_terminal(&a, &repo, &env, &["run", "claude", "--", agent], steps);
    assert!(out.contains("ready"), "{out}");
    assert!(out.contains("40 120"), "the caller's window size: {out}");
    assert!(out.contains("30 100"), "a resize follows the caller's window: {out}");
    assert!(out.contains("got-ctrl-c"), "Ctrl-C reached the agent: {out}");
    assert!(out.trim_end().ends_with("EXIT 7"), "{out}");
}

#[test]
fn real_claude_code_draws_its_tui_through_the_pty() {
    let Some(bin) = claude_code() else { return };
    let a = Agents::new();
    let repo = a.repo("tui");
    let h = Harness::start(&a.world, Options::default());
    let path = format!("{}:{SYSTEM_PATH}", bin.display());
    let env = [("PATH", path.as_ref()), ("AIRLOCK_SOCKET", h.socket().as_os_str())];
    // No allowed API host: Claude draws its welcome screen, checks connectivity through the
    // proxy, is refused, says so and exits.
    let out = on_a_terminal(&a, &repo, &env, &["run", "claude"], "");
    assert!(out.contains("\x1b["), "colors and cursor control come through: {out:?}");
    // Words are placed with cursor moves, not spaces.
    assert!(out.contains("Welcome") && out.contains("Claude"), "{out:?}");
    assert!(out.contains("api.anthropic.com"), "the refusal reached the TUI: {out:?}");
    assert!(!out.contains("TIMEOUT"), "{out:?}");
}

#[test]
fn doctor_shows_which_agents_run_would_find() {
    let a = Agents::new();
    let repo = a.repo("doctor");
    let run = a.world.airlock(&repo).env("PATH", a.path()).args(["doctor"]).run();
    let out = run.stdout();
    let claude = out.lines().find(|l| l.contains("agent") && l.contains("claude")).unwrap();
    assert!(claude.starts_with("[ok  ]"), "{out}");
    assert!(claude.contains("/opt/airlock/agents/claude/claude"), "relocated from the home: {out}");
    let codex = out.lines().position(|l| l.contains("codex: not installed")).unwrap();
    assert!(out.lines().nth(codex + 1).unwrap().contains("npm install -g @openai/codex"), "{out}");
}

#[test]
fn usage_errors_of_run_and_exec_are_airlocks_own_failure() {
    let a = Agents::new();
    let repo = a.repo("usage");
    // Arguments for the agent need `--`; without it the mistake is Airlock's 125, not a status
    // the agent could have returned.
    let run = a.world.airlock(&repo).args(["run", "claude", "-p", "hi"]).run().expect_code(125);
    assert!(run.stderr().contains("Usage: airlock run"), "{}", run.stderr());
    a.world.airlock(&repo).args(["exec"]).run().expect_code(125);
    a.world.airlock(&repo).args(["run", "--help"]).run().expect_code(0);
}

#[test]
fn real_claude_code_takes_a_piped_prompt() {
    let Some(bin) = claude_code() else { return };
    let a = Agents::new();
    let repo = a.repo("piped-claude");
    a.world.write(a.world.home.join(".airlock/config.toml"), API_KEY_POLICY);
    let h = Harness::start(&a.world, Options::default());
    let mut cmd = real_claude(&a, &bin, &repo, &h, &["-p"]);
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"say hello\n").unwrap();
    let out = finish(child);
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The prompt came through the pipe (without one, `claude -p` stops before calling the API),
    // and the proxy's refusal came back to Claude, which reports it.
    assert!(text.contains("api.anthropic.com:443 refused"), "{text}");
    assert!(refused_anthropic(&a.world, "piped-claude"), "{text}");
    assert_ne!(out.status.code(), Some(0), "{text}");
}

/// `airlock run codex` with a stand-in `codex` on PATH: Codex's own layout (docs/agents.md
/// "Where things live"): its home per repo at `/home/agent` with `.codex/`, `auth.json`
/// shared by copy (only the format's fields go back), both transcript roots hashed in the
/// session record, and nothing of Claude's.
#[test]
fn codex_gets_its_own_home_credential_and_transcripts() {
    let a = Agents::new();
    a.world.write_executable(
        a.fakebin.join("codex"),
        "#!/bin/sh\n# Stand-in for the Codex CLI: runs its first argument as a script.\nexec /bin/sh -c \"$1\"\n",
    );
    let codex_dir = a.world.home.join(".airlock/agent/codex");
    let shared = codex_dir.join("shared/auth.json");
    a.world.write(&shared, r#"{"OPENAI_API_KEY":"sk-v1"}"#);
    let repo = a.repo("cdx");
    a.world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(&a.world, Options::default());
    let script = "echo \"home=$HOME pwd=$(pwd) codex=$(command -v codex)\"; cat ~/.codex/auth.json; echo; \
        ls -A ~ ~/.codex; \
        mkdir -p ~/.codex/sessions/2026/12 ~/.codex/archived_sessions && \
        echo '{\"n\":1}' > ~/.codex/sessions/2026/12/rollout-1.jsonl && \
        echo '{\"n\":2}' > ~/.codex/archived_sessions/rollout-0.jsonl && echo notes > ~/.codex/notes.txt && \
        printf '%s' '{\"OPENAI_API_KEY\":\"sk-v2\",\"tokens\":{\"access_token\":\"at\"},\"extra\":\"stays\"}' \
          > ~/.codex/auth.json.tmp && mv ~/.codex/auth.json.tmp ~/.codex/auth.json && echo refreshed";
    let run = a
        .world
        .airlock(&repo)
        .env("PATH", a.path())
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["run", "codex", "--", script])
        .run()
        .expect_code(0);
    let out = run.stdout();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("home=/home/agent pwd=/cdx codex=/opt/airlock/bin/codex"));
    assert_eq!(json(lines.next().unwrap()), json(r#"{"OPENAI_API_KEY":"sk-v1"}"#), "{out}");
    let rest: Vec<&str> = lines.collect();
    assert_eq!(
        rest,
        [
            "/home/agent:",
            ".codex",
            ".gitconfig",
            "",
            "/home/agent/.codex:",
            "auth.json",
            "refreshed"
        ],
        "{out}\n{}",
        run.stderr()
    );

    // The home, on the host: Codex's, keyed by the repo; Claude's tree never made.
    let canonical = std::fs::canonicalize(&repo).unwrap();
    let digest = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
    let home = codex_dir.join(format!("cdx-{}", &digest[..8]));
    assert!(home.join(".codex/notes.txt").is_file(), "{}", home.display());
    assert!(!a.agent_dir().exists(), "a Codex session made Claude's directory");
    // Copy-back: only the format's fields reach the shared store; the rest stays in the home.
    assert_eq!(
        json(&std::fs::read_to_string(&shared).unwrap()),
        json(r#"{"OPENAI_API_KEY":"sk-v2","tokens":{"access_token":"at"}}"#)
    );
    let kept = json(&std::fs::read_to_string(home.join(".codex/auth.json")).unwrap());
    assert_eq!(kept["extra"], "stays");

    // The session record names the agent and hashes both transcript roots' new files.
    let recs = a.world.session_records("cdx");
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert_eq!(recs[0]["agent"], "codex");
    assert_eq!(recs[1]["exit_status"], 0);
    let hashed: Vec<(String, String)> = recs[1]["transcripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["path"].as_str().unwrap().into(), t["sha256"].as_str().unwrap().into()))
        .collect();
    let expect: Vec<(String, String)> =
        [".codex/archived_sessions/rollout-0.jsonl", ".codex/sessions/2026/12/rollout-1.jsonl"]
            .iter()
            .map(|f| (home.join(f).display().to_string(), sha256_file(&home.join(f))))
            .collect();
    assert_eq!(hashed, expect, "{}", recs[1]);
}
