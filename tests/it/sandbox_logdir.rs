//! Logs per checkout (docs/audit-format.md, Files), through real sessions of a real daemon: two
//! checkouts with one name get separate directories, each with a `.repo-path` naming it, and
//! `airlock logs` in each shows only its own lines; a name that sanitizes to dashes always gets
//! the key suffix; lines and session records carry `repo_key`. And the wall across sessions: an
//! agent cannot plant a `.repo-path` (or anything else) that redirects the host's next session
//! or `airlock logs`. Runs as root and, under `.ci/unprivileged`, as an unprivileged user.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::harness::{Harness, Options};
use crate::support::{World, have, jsonl_lines};

/// `<name>-<first 8 hex of SHA-256(canonical path)>`, computed here independently of the crate.
fn expected_key(name: &str, repo: &Path) -> String {
    let canonical = std::fs::canonicalize(repo).unwrap();
    let digest = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
    format!("{name}-{}", &digest[..8])
}

fn logs_root(w: &World) -> PathBuf {
    w.home.join(".airlock/logs")
}

/// One session in `repo` that asks the proxy for `http://<host>/` (refused: not allowed).
fn session_asking_for(w: &World, h: &Harness, repo: &Path, host: &str, extra: &str) -> String {
    let script = format!("curl -s -o /dev/null -m 5 http://{host}/; {extra} echo done");
    let run = w
        .airlock(repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &script])
        .run();
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}\nlog:\n{}",
        run.stdout(),
        run.stderr(),
        h.log()
    );
    run.stdout()
}

fn hosts(lines: &[Value]) -> Vec<String> {
    lines.iter().filter_map(|l| l["host"].as_str().map(str::to_owned)).collect()
}

fn world_with_user_layer() -> World {
    let w = World::new();
    w.write(w.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    w
}

#[test]
fn two_checkouts_with_one_name_get_their_own_directories_and_logs() {
    if !have("curl") {
        return;
    }
    let w = world_with_user_layer();
    let a = w.repo("a/pay");
    let b = w.repo("b/pay");
    let h = Harness::start(&w, Options::default());
    session_asking_for(&w, &h, &a, "from-a.test", "");
    session_asking_for(&w, &h, &b, "from-b.test", "");

    let root = logs_root(&w);
    let (key_a, key_b) = (expected_key("pay", &a), expected_key("pay", &b));
    let dir_a = root.join("pay");
    let dir_b = root.join(&key_b);
    let canonical = |p: &Path| format!("{}\n", std::fs::canonicalize(p).unwrap().display());
    assert_eq!(std::fs::read_to_string(dir_a.join(".repo-path")).unwrap(), canonical(&a));
    assert_eq!(std::fs::read_to_string(dir_b.join(".repo-path")).unwrap(), canonical(&b));

    let (lines_a, lines_b) = (jsonl_lines(&dir_a, "audit-"), jsonl_lines(&dir_b, "audit-"));
    assert_eq!(hosts(&lines_a), ["from-a.test"], "{lines_a:#?}");
    assert_eq!(hosts(&lines_b), ["from-b.test"], "{lines_b:#?}");
    assert!(lines_a.iter().all(|l| l["repo_key"] == key_a.as_str()), "{lines_a:#?}");
    assert!(lines_b.iter().all(|l| l["repo_key"] == key_b.as_str()), "{lines_b:#?}");
    for (dir, key) in [(&dir_a, &key_a), (&dir_b, &key_b)] {
        let records = jsonl_lines(dir, "sessions-");
        assert_eq!(records.len(), 2, "a start and an end record: {records:#?}");
        assert!(records.iter().all(|r| r["repo_key"] == key.as_str()), "{records:#?}");
    }

    // `airlock logs` in each checkout (and in a subdirectory) shows only its own lines.
    let json = |dir: &Path, args: &[&str]| {
        let run = w.airlock(dir).args(["logs", "--json"]).args(args).run().expect_code(0);
        run.stdout().lines().map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<Value>>()
    };
    std::fs::create_dir_all(a.join("src")).unwrap();
    assert_eq!(hosts(&json(&a.join("src"), &[])), ["from-a.test"]);
    assert_eq!(hosts(&json(&b, &[])), ["from-b.test"]);
    assert_eq!(hosts(&json(w.tmp.path(), &["--repo", b.to_str().unwrap()])), ["from-b.test"]);
    assert_eq!(hosts(&json(w.tmp.path(), &["--repo-name", &key_b])), ["from-b.test"]);
    // --all-repos: both, with the directory named in the table.
    let mut all = hosts(&json(w.tmp.path(), &["--all-repos"]));
    all.sort();
    assert_eq!(all, ["from-a.test", "from-b.test"]);
    let table = w.airlock(w.tmp.path()).args(["logs", "--all-repos"]).run().expect_code(0);
    let out = table.stdout();
    assert!(out.lines().next().unwrap().starts_with("REPO"), "{out}");
    let row_b = out.lines().find(|l| l.contains("from-b.test")).unwrap();
    assert!(row_b.starts_with(&key_b), "{out}");

    // `airlock logs sessions` reads the session records of this checkout only.
    let run = w.airlock(&a).args(["logs", "sessions", "--json"]).run().expect_code(0);
    let sessions: Vec<Value> =
        run.stdout().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(sessions.len(), 1, "{sessions:#?}");
    let s = &sessions[0];
    assert_eq!(
        (&s["exit_status"], &s["repo_key"], &s["log_dir"]),
        (&0.into(), &key_a.as_str().into(), &"pay".into())
    );
    assert_eq!(s["command"][0], "sh", "{s}");
    assert!(s["start"].is_string() && s["end"].is_string() && s["duration_ms"].is_u64(), "{s}");
    let id = s["session"].as_str().unwrap();
    assert!(lines_a.iter().all(|l| l["session"] == id));
    let table = w.airlock(&b).args(["logs", "sessions"]).run().expect_code(0).stdout();
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(!table.contains(id), "b's listing shows a's session: {table}");
}

#[test]
fn a_name_that_sanitizes_to_dashes_always_gets_the_key_suffix() {
    if !have("curl") {
        return;
    }
    let w = world_with_user_layer();
    let repo = w.repo("日本");
    let h = Harness::start(&w, Options::default());
    session_asking_for(&w, &h, &repo, "dashes.test", "");
    let key = expected_key("--", &repo);
    let root = logs_root(&w);
    assert!(!root.join("--").exists(), "the bare dashes name was used");
    let lines = jsonl_lines(&root.join(&key), "audit-");
    assert_eq!(hosts(&lines), ["dashes.test"], "{lines:#?}");
    assert_eq!(lines[0]["repo_key"], key.as_str());
    assert_eq!(lines[0]["repo"], "--");
}

/// Two steps: a session's agent tries to claim or redirect its checkout's log directory (the
/// host paths it would need are not there inside), then the next session and the host's
/// `airlock logs` still use the directory `.repo-path` named before.
#[test]
fn an_agent_cannot_redirect_the_log_directory_for_later_sessions() {
    if !have("curl") {
        return;
    }
    let w = world_with_user_layer();
    let repo = w.repo("plant");
    let h = Harness::start(&w, Options::default());
    let root = logs_root(&w);
    let dir = root.join("plant");
    let plant = format!(
        "for p in '{dir}/.repo-path' '{root}/plant-x/.repo-path' \"$HOME/.airlock/logs/plant/.repo-path\"; do \
           mkdir -p \"$(dirname \"$p\")\" 2>/dev/null; \
           if echo /elsewhere > \"$p\" 2>/dev/null; then echo \"wrote $p\"; fi; \
         done; ln -s /elsewhere .repo-path 2>/dev/null;",
        dir = dir.display(),
        root = root.display()
    );
    let out = session_asking_for(&w, &h, &repo, "first.test", &plant);
    assert!(out.contains("done"), "{out}");
    let canonical = format!("{}\n", std::fs::canonicalize(&repo).unwrap().display());
    assert_eq!(std::fs::read_to_string(dir.join(".repo-path")).unwrap(), canonical);
    assert!(!root.join("plant-x").exists(), "the agent made a directory under ~/.airlock/logs");

    session_asking_for(&w, &h, &repo, "second.test", "");
    assert_eq!(std::fs::read_to_string(dir.join(".repo-path")).unwrap(), canonical);
    assert_eq!(hosts(&jsonl_lines(&dir, "audit-")), ["first.test", "second.test"]);
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(names, ["plant"], "one checkout, one directory");
    let run = w.airlock(&repo).args(["logs", "--json"]).run().expect_code(0);
    assert_eq!(run.stdout().lines().count(), 2, "{}", run.stdout());
}
