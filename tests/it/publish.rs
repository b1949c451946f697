//! `airlock publish` against a real `airlockd review` on loopback (embedded store, and one run
//! on PostgreSQL): audit lines and session records of a real `airlock exec` session, the
//! transcript fixtures (every quirk, a subagent file, uuid-less lines) placed in agent homes,
//! append / truncate / replace / rotate / partial line, rejected items, `transcript.file` items,
//! no login (exit 125), `--json`, `--dry-run`, `--since`, and a symlink planted in an agent
//! home that must never be followed.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::review_support::{PgDb, Server, StoreSel, all_events, user_with_token};
use crate::support::{Run, World, airlock_stdin};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/transcripts").join(name),
    )
    .unwrap()
}

/// A world logged in to a fresh review server, with a repo `app`.
struct Plane {
    world: World,
    server: Server,
    token: String,
    repo: PathBuf,
    key: String,
}

impl Plane {
    fn new(store: impl FnOnce(&World) -> StoreSel) -> Self {
        let world = World::new();
        let store = store(&world);
        let token = user_with_token(&world, &store, "dev@example.test", "member");
        let server = Server::start(&world, &store, &[]);
        let repo = world.repo("app");
        airlock_stdin(
            &world,
            world.tmp.path(),
            &["login", "--server", &server.base, "--token-stdin"],
            &format!("{token}\n"),
        )
        .expect_code(0);
        let canon = std::fs::canonicalize(&repo).unwrap();
        let key = airlock::audit::logdir::repo_key("app", &canon);
        Plane { world, server, token, repo, key }
    }

    fn embedded() -> Self {
        Self::new(|w| StoreSel::Embedded(w.tmp.path().join("store")))
    }

    fn publish(&self, args: &[&str]) -> Run {
        self.world.airlock(&self.repo).args(["publish"]).args(args).run()
    }

    /// `airlock publish --json`, expecting success; the parsed object.
    fn publish_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let run = self.publish(&a);
        assert_eq!(run.code(), 0, "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
        serde_json::from_str(run.stdout().trim())
            .unwrap_or_else(|e| panic!("{e}: {}", run.stdout()))
    }

    fn events(&self, query: &str) -> Vec<Value> {
        all_events(&self.server.base, &self.token, query)
    }

    fn claude_projects(&self) -> PathBuf {
        self.world
            .home
            .join(".airlock/agent/claude")
            .join(&self.key)
            .join(".claude/projects/-work-app")
    }

    fn codex_sessions(&self) -> PathBuf {
        self.world
            .home
            .join(".airlock/agent/codex")
            .join(&self.key)
            .join(".codex/sessions/2026/03/04")
    }

    fn write(&self, path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

/// The ids publish must derive for a Claude file: `uuid`, else `<rel>:<offset>`, complete
/// lines only.
pub(crate) fn claude_ids(rel: &str, bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut off = 0usize;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        if line.ends_with(b"\n") {
            let v: Value = serde_json::from_slice(line).unwrap();
            out.push(match v["uuid"].as_str() {
                Some(u) => u.to_owned(),
                None => format!("{rel}:{off}"),
            });
        }
        off += line.len();
    }
    out
}

/// Codex ids: `<session_meta payload.id>:<offset>` (fallback: the path below `.codex`).
pub(crate) fn codex_ids(rel: &str, bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut session: Option<String> = None;
    let mut off = 0usize;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        if line.ends_with(b"\n") {
            let v: Value = serde_json::from_slice(line).unwrap();
            if session.is_none() && v["type"] == "session_meta" {
                session = v["payload"]["id"].as_str().map(str::to_owned);
            }
            out.push(format!("{}:{off}", session.as_deref().unwrap_or(rel)));
        }
        off += line.len();
    }
    out
}

fn complete_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|b| **b == b'\n').count() as u64
}

fn ids(events: &[Value]) -> BTreeSet<String> {
    events.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn without_a_server_login_publish_exits_125() {
    let world = World::new();
    let repo = world.repo("app");
    let run = world.airlock(&repo).args(["publish"]).run();
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(run.stderr().contains("airlock login --server"), "{}", run.stderr());
    // A dry run needs no login.
    world.airlock(&repo).args(["publish", "--dry-run"]).run().expect_code(0);
}

/// Places every transcript fixture (Claude: one per quirk, a subagent file, uuid-less lines and
/// a partial last line; Codex: each rollout) and publishes them; then the incremental cases.
fn transcripts_round_trip(p: &Plane) {
    let proj = p.claude_projects();
    let mut want_claude = BTreeSet::new();
    let mut want_codex = BTreeSet::new();
    let mut lines = 0u64;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/transcripts");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for name in &names {
        let bytes = fixture(name);
        lines += complete_lines(&bytes);
        if name.starts_with("claude-") {
            let rel = if name == "claude-subagent.jsonl" {
                "s-main/subagents/agent-1.jsonl".to_owned()
            } else {
                name.clone()
            };
            p.write(&proj.join(&rel), &bytes);
            want_claude.extend(claude_ids(&format!("-work-app/{rel}"), &bytes));
        } else {
            p.write(&p.codex_sessions().join(format!("rollout-{name}")), &bytes);
            want_codex.extend(codex_ids(&format!("sessions/2026/03/04/rollout-{name}"), &bytes));
        }
    }
    let r = p.publish_json(&[]);
    for k in ["created", "duplicate", "conflict", "rejected", "files", "bytes"] {
        assert!(r[k].is_u64(), "--json lacks {k}: {r}");
    }
    assert_eq!(r["files"], names.len(), "{r}");
    assert_eq!(r["rejected"], 0, "{r}");
    assert_eq!(
        r["created"].as_u64().unwrap()
            + r["duplicate"].as_u64().unwrap()
            + r["conflict"].as_u64().unwrap(),
        lines,
        "{r}"
    );
    let claude = p.events("&source=claude");
    assert_eq!(ids(&claude), want_claude);
    // The subagent file's lines (isSidechain) are there, verbatim.
    let sub_ids =
        claude_ids("-work-app/s-main/subagents/agent-1.jsonl", &fixture("claude-subagent.jsonl"));
    let sub = claude.iter().find(|e| e["id"] == sub_ids[0].as_str()).unwrap();
    assert_eq!(sub["payload"]["isSidechain"], true, "{sub}");
    let codex = p.events("&source=codex");
    assert_eq!(ids(&codex), want_codex);
    // Nothing changed: nothing read.
    let r = p.publish_json(&[]);
    assert_eq!((r["files"].as_u64(), r["created"].as_u64()), (Some(0), Some(0)), "{r}");

    // Partial line completed, plus an appended line.
    let trunc = proj.join("claude-truncated.jsonl");
    let mut f = std::fs::OpenOptions::new().append(true).open(&trunc).unwrap();
    f.write_all(b"id\":\"t1\"}\n{\"type\":\"summary\",\"summary\":\"s\"}\n").unwrap();
    drop(f);
    let bytes = std::fs::read(&trunc).unwrap();
    let before = p.events("&source=claude").len();
    let r = p.publish_json(&[]);
    assert_eq!((r["files"].as_u64(), r["created"].as_u64()), (Some(1), Some(2)), "{r}");
    assert_eq!(p.events("&source=claude").len(), before + 2);
    let want: BTreeSet<String> =
        claude_ids("-work-app/claude-truncated.jsonl", &bytes).into_iter().collect();
    let got: BTreeSet<String> =
        ids(&p.events("&source=claude")).intersection(&want).cloned().collect();
    assert_eq!(got, want);

    // Replaced: the last line rewritten at the same offset → conflict, reported, rejected.jsonl.
    let mut changed = bytes.clone();
    let n = changed.len();
    changed[n - 4] = b't';
    std::fs::write(&trunc, &changed).unwrap();
    let run = p.publish(&["--json"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let r: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(r["conflict"], 1, "{r}");
    assert!(
        run.stderr()
            .contains("rewritten transcript .claude/projects/-work-app/claude-truncated.jsonl"),
        "{}",
        run.stderr()
    );
    let rejected =
        std::fs::read_to_string(p.world.home.join(".airlock/publish/rejected.jsonl")).unwrap();
    let rj: Value = serde_json::from_str(rejected.lines().last().unwrap()).unwrap();
    assert_eq!(
        (rj["code"].as_u64(), rj["status"].as_str(), rj["source"].as_str()),
        (Some(409), Some("conflict"), Some("claude")),
        "{rj}"
    );
    assert!(rj["id"].as_str().unwrap().starts_with("-work-app/claude-truncated.jsonl:"), "{rj}");

    // Truncated to its first line: read again from 0, a duplicate.
    let first = bytes.split_inclusive(|b| *b == b'\n').next().unwrap().to_vec();
    std::fs::write(&trunc, &first).unwrap();
    let r = p.publish_json(&[]);
    assert_eq!(
        (r["created"].as_u64(), r["duplicate"].as_u64(), r["conflict"].as_u64()),
        (Some(0), Some(1), Some(0)),
        "{r}"
    );
}

#[test]
fn transcripts_are_published_with_their_ids_and_incrementally() {
    let p = Plane::embedded();
    transcripts_round_trip(&p);
}

#[test]
fn transcripts_are_published_to_postgresql() {
    let Some(db) = PgDb::create() else { return };
    let p = Plane::new(|w| {
        db.migrate(w);
        StoreSel::Pg(db.runtime_url.clone())
    });
    transcripts_round_trip(&p);
}

/// Audit lines and session records of a real `airlock exec` session reach the server, counted
/// exactly; a rotated (new dated) audit file is a new file; `transcript.file` items are sent.
#[test]
fn a_real_sessions_audit_lines_and_records_are_published_and_counted() {
    use crate::harness::{Harness, Options};
    if !crate::support::have("curl") {
        return;
    }
    let p = Plane::embedded();
    p.world.write(
        p.world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n",
    );
    let h = Harness::start(&p.world, Options::default());
    for _ in 0..2 {
        let run = p
            .world
            .airlock(&p.repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args([
                "exec",
                "--",
                "sh",
                "-c",
                "curl -s -o /dev/null -m 5 http://denied.test/; echo done",
            ])
            .run();
        assert_eq!(run.code(), 0, "{}\n{}\n{}", run.stdout(), run.stderr(), h.log());
    }
    let dir = p.world.home.join(".airlock/logs/app");
    let audit = crate::support::jsonl_lines(&dir, "audit-");
    let records = crate::support::jsonl_lines(&dir, "sessions-");
    assert!(!audit.is_empty());
    assert_eq!(records.len(), 4);

    // A transcript the first session's end record lists (as `airlock run` writes it).
    let proj = p.claude_projects();
    let line1 = fixture("claude-happy-path.jsonl");
    p.write(&proj.join("abc.jsonl"), &line1);
    let session = records[1]["session"].as_str().unwrap().to_owned();
    let path = proj.join("abc.jsonl");
    let end = serde_json::json!({"id": format!("{session}-x:end"), "kind": "end", "ts": "2026-03-04T10:00:00.000Z",
        "session": format!("{session}-x"), "boot": "b", "repo": "app",
        "transcripts": [{"path": path.to_string_lossy(), "file": ".claude/projects/-work-app/abc.jsonl",
                         "bytes": line1.len(), "sha256": format!("sha256:{}", sha256_hex(&line1))}]});
    let rotated = dir.join("sessions-2099-01-01.jsonl");
    std::fs::write(&rotated, format!("{end}\n")).unwrap();

    let r = p.publish_json(&[]);
    assert_eq!(r["rejected"], 0, "{r}");
    let egress = p.events("&source=egress");
    assert_eq!(egress.len(), audit.len(), "{r}");
    assert_eq!(ids(&egress), audit.iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect());
    assert!(
        egress.iter().all(|e| e["type"] == "denied" || e["type"] == "http" || e["type"] == "dns"),
        "{egress:#?}"
    );
    let sessions = p.events("&source=session");
    let tf: Vec<&Value> = sessions.iter().filter(|e| e["type"] == "transcript.file").collect();
    assert_eq!(tf.len(), 1, "{sessions:#?}");
    assert_eq!(tf[0]["payload"]["bytes"], line1.len());
    assert_eq!(tf[0]["payload"]["sha256"], format!("sha256:{}", sha256_hex(&line1)));
    assert_eq!(sessions.len(), records.len() + 2, "{sessions:#?}");
    assert_eq!(p.events("&source=claude").len() as u64, complete_lines(&line1));

    // A new dated audit file (rotation) is just a new file.
    let rotated_audit = dir.join("audit-2099-01-01.jsonl");
    let mut line = audit[0].clone();
    line["id"] = Value::from("rotated-1");
    std::fs::write(&rotated_audit, format!("{line}\n")).unwrap();
    let r = p.publish_json(&[]);
    assert_eq!((r["files"].as_u64(), r["created"].as_u64()), (Some(1), Some(1)), "{r}");
    assert_eq!(p.events("&source=egress").len(), audit.len() + 1);
}

/// A session's `phase` line (issue 20) is published as egress `type` `phase` and accepted by
/// the review server's ingest; the lines decided under the phase carry it in their payload.
#[test]
fn phase_lines_are_published_as_their_own_egress_type() {
    use crate::harness::{Harness, Options};
    if !crate::support::have("curl") {
        return;
    }
    let p = Plane::embedded();
    p.world.write(
        p.world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[phase.build.network]\nallow = [\"build.test\"]\n",
    );
    let h = Harness::start(&p.world, Options::default());
    let run = p
        .world
        .airlock(&p.repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--phase", "build", "--", "sh", "-c"])
        .args(["curl -s -o /dev/null -m 5 http://denied.test/; echo done"])
        .run();
    assert_eq!(run.code(), 0, "{}\n{}\n{}", run.stdout(), run.stderr(), h.log());
    let r = p.publish_json(&[]);
    assert_eq!(r["rejected"], 0, "{r}");
    let egress = p.events("&source=egress");
    let phase: Vec<&Value> = egress.iter().filter(|e| e["type"] == "phase").collect();
    assert_eq!(phase.len(), 1, "{egress:#?}");
    assert_eq!(phase[0]["payload"]["phase"], "build");
    assert_eq!(phase[0]["payload"]["by"], "start");
    let denied = egress.iter().find(|e| e["type"] == "denied").expect("the refused attempt");
    assert_eq!(denied["payload"]["phase"], "build", "{denied}");
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// A symlink planted in an agent home (to a file outside, and a symlinked directory) is
/// reported and never followed: the secret's bytes never reach the server.
#[test]
fn a_symlink_planted_in_an_agent_home_is_never_followed() {
    let p = Plane::embedded();
    let secret = p.world.tmp.path().join("outside/secret.jsonl");
    let marker = "SECRET-7f3a9c-never-published";
    p.write(
        &secret,
        format!("{{\"type\":\"user\",\"uuid\":\"s1\",\"message\":\"{marker}\"}}\n").as_bytes(),
    );
    let proj = p.claude_projects();
    p.write(&proj.join("real.jsonl"), &fixture("claude-happy-path.jsonl"));
    std::os::unix::fs::symlink(&secret, proj.join("evil.jsonl")).unwrap();
    std::os::unix::fs::symlink(secret.parent().unwrap(), proj.join("evil-dir")).unwrap();
    let codex = p.codex_sessions();
    std::fs::create_dir_all(&codex).unwrap();
    std::os::unix::fs::symlink(&secret, codex.join("rollout-evil.jsonl")).unwrap();
    let run = p.publish(&[]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    assert!(run.stderr().contains("evil.jsonl: a symlink, never followed"), "{}", run.stderr());
    assert!(
        run.stderr().contains("rollout-evil.jsonl: a symlink, never followed"),
        "{}",
        run.stderr()
    );
    let all = p.events("");
    assert!(!all.is_empty(), "{}", run.stderr());
    let dump = serde_json::to_string(&all).unwrap();
    assert!(!dump.contains(marker), "the symlink's target reached the server");
    assert!(!dump.contains("\"s1\""));
}

/// `--dry-run` sends and records nothing; `--since` sends only newer lines and does not
/// advance the state, so the next plain publish sends the rest.
#[test]
fn dry_run_sends_nothing_and_since_is_a_one_off_view() {
    let p = Plane::embedded();
    let proj = p.claude_projects();
    let lines = [
        r#"{"type":"user","uuid":"old-1","timestamp":"2020-01-01T00:00:00.000Z","message":{"role":"user","content":"a"}}"#,
        r#"{"type":"user","uuid":"new-1","timestamp":"2099-01-01T00:00:00.000Z","message":{"role":"user","content":"b"}}"#,
    ];
    p.write(&proj.join("t.jsonl"), format!("{}\n{}\n", lines[0], lines[1]).as_bytes());
    let run = p.publish(&["--dry-run"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    assert!(run.stdout().contains("t.jsonl\t2 lines"), "{}", run.stdout());
    assert!(p.events("").is_empty());
    assert!(!p.world.home.join(".airlock/publish/state.json").exists());
    let r = p.publish_json(&["--since", "2030-01-01"]);
    assert_eq!(r["created"], 1, "{r}");
    assert_eq!(ids(&p.events("&source=claude")), BTreeSet::from(["new-1".to_owned()]));
    let r = p.publish_json(&[]);
    assert_eq!((r["created"].as_u64(), r["duplicate"].as_u64()), (Some(1), Some(1)), "{r}");
}

/// A line that cannot be an item and an item the server refuses both end in rejected.jsonl.
#[test]
fn refused_lines_and_items_are_kept_in_rejected_jsonl() {
    let p = Plane::embedded();
    let dir = p.world.home.join(".airlock/logs/app");
    std::fs::create_dir_all(&dir).unwrap();
    let canon = std::fs::canonicalize(&p.repo).unwrap();
    std::fs::write(dir.join(".repo-path"), format!("{}\n", canon.display())).unwrap();
    let good = r#"{"ts":"2026-07-24T18:03:12.905Z","repo":"app","host":"h","method":"CONNECT","allowed":false,"id":"e-1","session":"s","boot":"b","seq":1,"reason":"not_allowed"}"#;
    // Not JSON: refused before sending. A NUL in `id`: refused by the server (400).
    let nul = r#"{"ts":"2026-07-24T18:03:12.905Z","repo":"app","host":"h","method":"CONNECT","allowed":false,"id":"e-\u0000","session":"s","boot":"b","seq":2,"reason":"not_allowed"}"#;
    std::fs::write(
        dir.join("audit-2026-07-24.jsonl"),
        format!("{good}\n{{\"id\": broken\n{nul}\n"),
    )
    .unwrap();
    let r = p.publish_json(&[]);
    assert_eq!((r["created"].as_u64(), r["rejected"].as_u64()), (Some(1), Some(2)), "{r}");
    let rejected =
        std::fs::read_to_string(p.world.home.join(".airlock/publish/rejected.jsonl")).unwrap();
    let rows: Vec<Value> = rejected.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "{rejected}");
    assert_eq!(
        (rows[0]["code"].as_u64(), rows[0]["status"].as_str()),
        (Some(0), Some("refused")),
        "{rejected}"
    );
    assert_eq!(rows[1]["code"], 400, "{rejected}");
    for row in &rows {
        for k in ["ts", "file", "offset", "id", "source", "code", "status", "error"] {
            assert!(row.get(k).is_some(), "{k} missing: {row}");
        }
    }
    // Recorded, not retried forever: the next run has nothing to send.
    let r = p.publish_json(&[]);
    assert_eq!(r["files"], 0, "{r}");
}

/// `[publish] auto = true`: with the server down the session's exit status is its own and the
/// lines wait; the next session (server back) publishes both sessions' lines.
#[test]
fn auto_publish_after_exec_never_changes_the_exit_status_and_catches_up() {
    use crate::harness::{Harness, Options};
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let repo = world.repo("app");
    let login = |base: &str| {
        airlock_stdin(
            &world,
            world.tmp.path(),
            &["login", "--server", base, "--token-stdin"],
            &format!("{token}\n"),
        )
        .expect_code(0);
    };
    login(&server.base);
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[publish]\nauto = true\ntimeout = \"5s\"\n",
    );
    let h = Harness::start(&world, Options::default());
    let session = |code: i32| {
        let run = world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec", "--", "sh", "-c", &format!("exit {code}")])
            .run();
        assert_eq!(run.code(), code, "{}\n{}\n{}", run.stdout(), run.stderr(), h.log());
        run
    };
    drop(server); // the review plane is down
    let run = session(3);
    assert!(run.stderr().contains("publish at session end failed"), "{}", run.stderr());

    let server = Server::start(&world, &store, &[]);
    login(&server.base);
    let run = session(0);
    assert!(run.stderr().contains("airlock: published"), "{}", run.stderr());
    let dir = world.home.join(".airlock/logs/app");
    let records = crate::support::jsonl_lines(&dir, "sessions-");
    assert_eq!(records.len(), 4, "{records:#?}");
    let stored = all_events(&server.base, &token, "&source=session");
    // Both sessions' start and end records: the one published late included.
    let ids: BTreeSet<String> =
        stored.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    for r in &records {
        let kind = r["kind"].as_str().unwrap();
        let id = format!("{}:{kind}", r["session"].as_str().unwrap());
        assert!(ids.contains(&id), "{id} not published: {ids:?}");
    }
}
