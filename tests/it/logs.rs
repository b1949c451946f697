//! `airlock logs` against real log files, the page's jq recipe, `--follow` across a new date
//! file, and a writer killed with SIGKILL mid-tunnel whose attempt is settled exactly once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use airlock::audit::{AuditLine, AuditSink, FileAuditSink, SessionInfo, encode_line, utc_date};
#[cfg(feature = "test-hooks")]
use airlock::audit::{RepoLog, settle_journals};
use airlock::policy::{LayerKind, Reason};

#[cfg(feature = "test-hooks")]
use crate::support::bin;
use crate::support::{World, in_ci};

/// How long to wait for a child's output before failing (generous: the machine is shared).
const PATIENCE: Duration = Duration::from_secs(30);

fn logs_dir(w: &World, repo: &str) -> PathBuf {
    w.home.join(".airlock/logs").join(repo)
}

fn today_file(dir: &Path) -> PathBuf {
    dir.join(format!("audit-{}.jsonl", utc_date(SystemTime::now())))
}

fn info(repo: &str) -> SessionInfo {
    SessionInfo {
        session: "sess-1".into(),
        repo: repo.into(),
        repo_path: Some(format!("/src/{repo}")),
        repo_key: None,
        user_id: Some("41f0c2aa".into()),
    }
}

fn deny(sink: &FileAuditSink, host: &str) -> AuditLine {
    let mut l = sink.line(host, Some(443), "CONNECT");
    l.reason = Some(Reason::NotAllowed);
    l.layer = Some(LayerKind::None);
    l.duration_ms = Some(0);
    sink.append(&l).unwrap();
    l
}

fn allow(sink: &FileAuditSink, host: &str, sent: u64, recv: u64) -> AuditLine {
    let mut l = sink.line(host, Some(443), "CONNECT");
    l.allowed = true;
    l.reason = Some(Reason::Allowed);
    l.layer = Some(LayerKind::Repo);
    sink.journal_open(&l).unwrap();
    l.bytes_sent = Some(sent);
    l.bytes_recv = Some(recv);
    l.duration_ms = Some(2311);
    l.addr = Some("127.0.0.2:443".into());
    sink.journal_close(&l).unwrap();
    l
}

/// A repo `some-repo` with a few lines of today, one old line, one in-flight tunnel and a
/// session record. Returns the live sink (its journal stays locked while it lives).
fn populated(w: &World) -> (PathBuf, PathBuf, FileAuditSink, AuditLine) {
    let repo = w.repo("some-repo");
    let dir = logs_dir(w, "some-repo");
    let sink = FileAuditSink::open(&dir, "boot-a", info("some-repo")).unwrap();
    allow(&sink, "api.anthropic.com", 18204, 91544);
    deny(&sink, "pastebin.com");
    allow(&sink, "anthropic.com", 1, 2);
    deny(&sink, "evil.example");
    let mut open = sink.line("openrouter.ai", Some(443), "CONNECT");
    open.allowed = true;
    sink.journal_open(&open).unwrap();
    // An old line, in its own date's file.
    let mut old = sink.line("old.example", Some(443), "CONNECT");
    old.ts = "2020-01-01T00:00:00.000Z".into();
    old.reason = Some(Reason::Blocked);
    w.write(
        dir.join("audit-2020-01-01.jsonl"),
        &String::from_utf8(encode_line(&old).unwrap()).unwrap(),
    );
    // A session record (written by the daemon) shares the directory.
    w.write(
        dir.join(format!("sessions-{}.jsonl", utc_date(SystemTime::now()))),
        "{\"id\":\"sess-1:start\",\"session\":\"sess-1\",\"command\":[\"claude\"]}\n",
    );
    (repo, dir, sink, open)
}

fn data_rows(out: &str) -> Vec<&str> {
    out.lines().skip(1).collect()
}

#[test]
fn table_shows_every_attempt_and_in_flight_records() {
    let w = World::new();
    let (repo, _dir, _sink, _open) = populated(&w);
    let run = w.airlock(&repo.join(".git")).args(["logs"]).run().expect_code(0);
    let out = run.stdout();
    let header = out.lines().next().unwrap();
    for col in ["TIME", "USER", "HOST", "METHOD", "VERDICT", "BYTES", "DURATION", "REASON"] {
        assert!(header.contains(col), "{header}");
    }
    let rows = data_rows(&out);
    assert_eq!(rows.len(), 6, "{out}");
    assert!(rows[0].contains("old.example:443") && rows[0].contains("DENY"), "{out}");
    let anth = rows.iter().find(|r| r.contains("api.anthropic.com:443")).unwrap();
    assert!(anth.contains("ALLOW") && anth.contains("18204/91544") && anth.contains("2.3s"));
    assert!(anth.contains("41f0c2aa"));
    let paste = rows.iter().find(|r| r.contains("pastebin.com:443")).unwrap();
    assert!(paste.contains("DENY") && paste.contains("not_allowed (none)"), "{paste}");
    let open = rows.last().unwrap();
    assert!(open.contains("openrouter.ai:443") && open.contains("OPEN"), "{out}");
    assert!(open.contains("in flight"));
}

#[test]
fn filters_select_verdicts_hosts_and_times() {
    let w = World::new();
    let (repo, _dir, _sink, _open) = populated(&w);
    let hosts = |args: &[&str]| -> Vec<String> {
        let run = w.airlock(&repo).args(["logs", "--json"]).args(args).run().expect_code(0);
        run.stdout()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["host"].to_string())
            .map(|h| h.trim_matches('"').to_owned())
            .collect()
    };
    assert_eq!(hosts(&["--denied"]), ["old.example", "pastebin.com", "evil.example"]);
    assert_eq!(hosts(&["--allowed"]), ["api.anthropic.com", "anthropic.com", "openrouter.ai"]);
    assert_eq!(hosts(&["--host", "anthropic.com"]), ["api.anthropic.com", "anthropic.com"]);
    assert_eq!(hosts(&["--host", "api.anthropic.com"]), ["api.anthropic.com"]);
    assert_eq!(hosts(&["--denied", "--since", "2h"]), ["pastebin.com", "evil.example"]);
    assert_eq!(
        hosts(&["--since", "2019-12-31T23:00:00Z", "--host", "old.example"]),
        ["old.example"]
    );
    assert!(hosts(&["--since", "2099-01-01"]).is_empty());
    // --repo-name and --repo pick the same logs from anywhere.
    let elsewhere = w.tmp.path();
    let by_name = w.airlock(elsewhere).args(["logs", "--repo-name", "some-repo"]).run();
    let by_dir = w.airlock(elsewhere).args(["logs", "--repo"]).args([&repo]).run();
    assert_eq!(data_rows(&by_name.expect_code(0).stdout()).len(), 6);
    assert_eq!(data_rows(&by_dir.expect_code(0).stdout()).len(), 6);
}

#[test]
fn json_passes_lines_through_verbatim() {
    let w = World::new();
    let (repo, dir, _sink, open) = populated(&w);
    let out = w.airlock(&repo).args(["logs", "--json"]).run().expect_code(0).stdout();
    let mut want = std::fs::read_to_string(dir.join("audit-2020-01-01.jsonl")).unwrap();
    want.push_str(&std::fs::read_to_string(today_file(&dir)).unwrap());
    let (written, in_flight) = out.split_at(want.len());
    assert_eq!(written, want);
    let rec: serde_json::Value = serde_json::from_str(in_flight.trim_end()).unwrap();
    assert_eq!(rec["in_flight"], true);
    assert_eq!(rec["id"], open.id.as_str());
}

#[test]
fn bad_flags_and_bad_lines_get_clear_messages() {
    let w = World::new();
    let (repo, dir, _sink, _open) = populated(&w);
    let both = w.airlock(&repo).args(["logs", "--denied", "--allowed"]).run().expect_code(2);
    assert!(both.stderr().contains("--allowed"), "{}", both.stderr());
    let since = w.airlock(&repo).args(["logs", "--since", "last tuesday"]).run().expect_code(2);
    assert!(since.stderr().contains("RFC 3339"), "{}", since.stderr());
    let name = w.airlock(&repo).args(["logs", "--repo-name", "Bad/Name"]).run().expect_code(1);
    assert!(name.stderr().contains("not a valid repo name"), "{}", name.stderr());
    // A corrupt line is reported with file:line and the rest is still shown.
    let today = today_file(&dir);
    let mut text = std::fs::read_to_string(&today).unwrap();
    text.insert_str(0, "{\"broken\n");
    std::fs::write(&today, text).unwrap();
    let run = w.airlock(&repo).args(["logs"]).run().expect_code(0);
    assert_eq!(data_rows(&run.stdout()).len(), 6);
    assert!(run.stderr().contains(&format!("{}:1:", today.display())), "{}", run.stderr());
    // A repo without logs is not an error.
    let empty = w.repo("empty-repo");
    let run = w.airlock(&empty).args(["logs"]).run().expect_code(0);
    assert!(run.stderr().contains("no audit log for repo empty-repo"), "{}", run.stderr());
}

/// The product page's recipe over `*.jsonl` (audit, journal and session files alike) yields
/// exactly the refused hosts.
#[test]
fn page_jq_recipe_yields_only_denied_hosts() {
    if Command::new("jq").arg("--version").output().is_err() {
        assert!(!in_ci(), "jq is required in CI for the product page's recipe");
        eprintln!("skipping: jq not installed");
        return;
    }
    let w = World::new();
    let (_repo, dir, sink, _open) = populated(&w);
    // Hostile hosts in a journal record must not leak into the recipe's output either.
    let mut evil = sink.line("journal-only.example", Some(443), "CONNECT");
    evil.allowed = true;
    sink.journal_open(&evil).unwrap();
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert!(names.iter().any(|n| n.to_string_lossy().starts_with("journal-")), "{names:?}");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "jq -r 'select(.allowed == false) | .host' '{}'/*.jsonl | sort -u",
            dir.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "evil.example\nold.example\npastebin.com\n");
}

/// Reads a child's stdout lines on a thread so the test can wait with a timeout.
fn line_reader(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn follow_picks_up_new_lines_and_new_date_files() {
    let w = World::new();
    let repo = w.repo("some-repo");
    let dir = logs_dir(&w, "some-repo");
    let sink = FileAuditSink::open(&dir, "boot-f", info("some-repo")).unwrap();
    let first = deny(&sink, "first.example");
    let mut cmd = w.airlock(&repo).args(["logs", "--follow", "--json"]).cmd;
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let rx = line_reader(&mut child.0);
    let id_of = |l: String| -> String {
        serde_json::from_str::<serde_json::Value>(&l).unwrap()["id"].as_str().unwrap().to_owned()
    };
    assert_eq!(id_of(rx.recv_timeout(PATIENCE).unwrap()), first.id);
    // A line appended to today's file.
    let second = deny(&sink, "second.example");
    assert_eq!(id_of(rx.recv_timeout(PATIENCE).unwrap()), second.id);
    // A new date file appearing (what rotation at midnight looks like to a reader).
    let mut next = sink.line("tomorrow.example", Some(443), "CONNECT");
    next.ts = "2099-01-01T00:00:00.001Z".into();
    w.write(
        dir.join("audit-2099-01-01.jsonl"),
        &String::from_utf8(encode_line(&next).unwrap()).unwrap(),
    );
    assert_eq!(id_of(rx.recv_timeout(PATIENCE).unwrap()), next.id);
    // And again in the old file, which a writer may still be finishing.
    let third = allow(&sink, "third.example", 1, 1);
    assert_eq!(id_of(rx.recv_timeout(PATIENCE).unwrap()), third.id);
}

/// A writer killed with SIGKILL while a tunnel is open: while it lives its journal is left
/// alone and readers show the attempt in flight; after its death the next writer settles the
/// attempt as interrupted, exactly once, however often settlement runs.
#[cfg(feature = "test-hooks")] // the test-only `airlock __audit-hold`
#[test]
fn sigkilled_writer_is_settled_exactly_once() {
    let w = World::new();
    let repo = w.repo("some-repo");
    let dir = logs_dir(&w, "some-repo");
    let mut child = KillOnDrop(
        Command::new(bin("airlock"))
            .args(["__audit-hold", "--boot", "doomed", "--open", "1", "--log-dir"])
            .arg(&dir)
            .env_clear()
            .env("HOME", &w.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rx = line_reader(&mut child.0);
    let held = rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap(), "ready");

    // Alive: its journal is locked, so no one settles it.
    let report = settle_journals(&dir).unwrap();
    assert_eq!((report.busy, report.lines_written), (1, 0));
    let shown = w.airlock(&repo).args(["logs", "--json", "--allowed"]).run().expect_code(0);
    let open: Vec<serde_json::Value> =
        shown.stdout().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(open.len(), 2, "{}", shown.stdout());
    assert_eq!(open[1]["id"], held.as_str());
    assert_eq!(open[1]["in_flight"], true);

    // kill -9, then a new writer starts in the same directory.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let restarted = RepoLog::open(&dir, "next-boot").unwrap();
    assert_eq!(restarted.settled().lines_written, 1);
    assert!(!dir.join("journal-doomed.jsonl").exists());
    drop(restarted);
    let again = RepoLog::open(&dir, "third-boot").unwrap();
    assert_eq!(again.settled().lines_written, 0);
    assert_eq!(settle_journals(&dir).unwrap().lines_written, 0);

    let lines: Vec<AuditLine> = std::fs::read_to_string(today_file(&dir))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let settled: Vec<_> = lines.iter().filter(|l| l.id == held).collect();
    assert_eq!(settled.len(), 1, "{lines:?}");
    let line = settled[0];
    assert_eq!(line.interrupted, Some(true));
    assert_eq!(line.reason, Some(Reason::Interrupted));
    assert!(line.allowed);
    assert_eq!((line.host.as_str(), line.boot.as_str()), ("held-0.test", "doomed"));

    let table = w.airlock(&repo).args(["logs"]).run().expect_code(0).stdout();
    let row = table.lines().find(|r| r.contains("held-0.test")).unwrap();
    assert!(row.contains("INTR") && !table.contains("OPEN"), "{table}");
}

/// The canonical path of `p` and a newline: what `.repo-path` holds.
fn repo_path_text(p: &Path) -> String {
    format!("{}\n", std::fs::canonicalize(p).unwrap().display())
}

fn json_hosts(w: &World, cwd: &Path, args: &[&str]) -> Vec<String> {
    let run = w.airlock(cwd).args(["logs", "--json"]).args(args).run().expect_code(0);
    run.stdout()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["host"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn session_reason_method_and_until_filters() {
    let w = World::new();
    let (repo, dir, _sink, _open) = populated(&w);
    // A second session in the same checkout: one plain-HTTP GET refused by a block entry.
    let other = FileAuditSink::open(
        &dir,
        "boot-b",
        SessionInfo { session: "sess-2".into(), ..info("some-repo") },
    )
    .unwrap();
    let mut get = other.line("get.example", Some(80), "GET");
    get.reason = Some(Reason::Blocked);
    get.layer = Some(LayerKind::User);
    get.duration_ms = Some(0);
    other.append(&get).unwrap();
    let hosts = |args: &[&str]| json_hosts(&w, &repo, args);
    assert_eq!(hosts(&["--session", "sess-2"]), ["get.example"]);
    assert_eq!(
        hosts(&["--session", "sess-1", "--denied"]),
        ["old.example", "pastebin.com", "evil.example"]
    );
    assert!(hosts(&["--session", "nope"]).is_empty());
    assert_eq!(hosts(&["--reason", "blocked"]), ["old.example", "get.example"]);
    assert_eq!(hosts(&["--reason", "not_allowed"]), ["pastebin.com", "evil.example"]);
    assert_eq!(hosts(&["--method", "get"]), ["get.example"]);
    assert_eq!(hosts(&["--method", "CONNECT", "--allowed"]).len(), 3);
    // --until: exclusive, a date is its midnight, a duration is that long ago.
    assert_eq!(hosts(&["--until", "2021-01-01"]), ["old.example"]);
    assert_eq!(hosts(&["--until", "1h"]), ["old.example"]);
    assert!(hosts(&["--until", "2020-01-01"]).is_empty());
    assert_eq!(hosts(&["--since", "2020-01-01", "--until", "2020-01-02"]), ["old.example"]);
    assert_eq!(
        hosts(&["--since", "2h", "--until", "2099-01-01", "--reason", "blocked"]),
        ["get.example"]
    );
    // Nonsense is refused by name.
    let bad = w.airlock(&repo).args(["logs", "--reason", "bogus"]).run().expect_code(2);
    assert!(bad.stderr().contains("is not a reason code"), "{}", bad.stderr());
    let bad = w.airlock(&repo).args(["logs", "--until", "soonish"]).run().expect_code(2);
    assert!(bad.stderr().contains("RFC 3339"), "{}", bad.stderr());
    let bad = w.airlock(&repo).args(["logs", "--method", "G T"]).run().expect_code(2);
    assert!(bad.stderr().contains("not a method"), "{}", bad.stderr());
    let bad = w.airlock(&repo).args(["logs", "--all-repos", "--repo-name", "x"]).run();
    assert!(bad.expect_code(2).stderr().contains("--all-repos"));
}

#[test]
fn a_directory_from_before_repo_path_is_adopted_by_the_first_checkout_only() {
    let w = World::new();
    let (repo, dir, _sink, _open) = populated(&w);
    assert!(!dir.join(".repo-path").exists());
    assert_eq!(json_hosts(&w, &repo, &["--host", "pastebin.com"]), ["pastebin.com"]);
    assert_eq!(std::fs::read_to_string(dir.join(".repo-path")).unwrap(), repo_path_text(&repo));
    // Another checkout with the same name sees none of it, and a reader creates nothing.
    let other = w.repo("elsewhere/some-repo");
    let run = w.airlock(&other).args(["logs"]).run().expect_code(0);
    assert!(run.stdout().is_empty(), "{}", run.stdout());
    assert!(run.stderr().contains("no audit log for repo some-repo"), "{}", run.stderr());
    let mut names: Vec<String> = std::fs::read_dir(w.home.join(".airlock/logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".lock", "some-repo"]);
    // The first checkout keeps it.
    assert_eq!(json_hosts(&w, &repo, &["--host", "pastebin.com"]), ["pastebin.com"]);
}

#[test]
fn logs_sessions_joins_start_and_end_records() {
    let w = World::new();
    // A repo literally named `sessions`: flags name it; the bare word is the subcommand.
    let repo = w.repo("sessions");
    let dir = logs_dir(&w, "sessions");
    w.write(dir.join(".repo-path"), &repo_path_text(&repo));
    w.write(
        dir.join("sessions-2026-07-24.jsonl"),
        concat!(
            r#"{"id":"s1:start","kind":"start","ts":"2026-07-24T18:00:00.000Z","session":"s1","boot":"b","repo":"sessions","repo_key":"sessions-0a1b2c3d","repo_path":"/x","command":["claude","-p","hi"],"agent":"claude"}"#,
            "\n",
            r#"{"id":"s1:end","kind":"end","ts":"2026-07-24T18:02:03.000Z","session":"s1","boot":"b","repo":"sessions","repo_key":"sessions-0a1b2c3d","exit_status":0,"tunnels":1,"bytes_sent":2,"bytes_recv":3}"#,
            "\n",
            r#"{"id":"s2:start","kind":"start","ts":"2026-07-24T23:59:00.000Z","session":"s2","boot":"b","repo":"sessions","command":["sh"]}"#,
            "\n",
        ),
    );
    w.write(
        dir.join("sessions-2026-07-25.jsonl"),
        concat!(
            r#"{"id":"s2:end","kind":"end","ts":"2026-07-25T00:01:00.000Z","session":"s2","boot":"b2","repo":"sessions","end_reason":"supervisor_lost","tunnels":0,"bytes_sent":0,"bytes_recv":0}"#,
            "\n",
            r#"{"id":"s3:start","kind":"start","ts":"2026-07-25T09:00:00.000Z","session":"s3","boot":"b2","repo":"sessions","command":["codex"],"agent":"codex"}"#,
            "\n",
        ),
    );
    let sessions = |args: &[&str]| -> Vec<serde_json::Value> {
        let run = w.airlock(&repo).args(["logs", "sessions", "--json"]).args(args).run();
        run.expect_code(0).stdout().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let all = sessions(&[]);
    let ids: Vec<&str> = all.iter().map(|s| s["session"].as_str().unwrap()).collect();
    assert_eq!(ids, ["s1", "s2", "s3"]);
    assert_eq!(all[0]["duration_ms"], 123_000);
    assert_eq!(all[0]["exit_status"], 0);
    assert_eq!(all[0]["agent"], "claude");
    assert_eq!(all[0]["command"], serde_json::json!(["claude", "-p", "hi"]));
    assert_eq!(all[0]["repo_key"], "sessions-0a1b2c3d");
    assert_eq!(all[1]["end_reason"], "supervisor_lost");
    assert_eq!(all[1]["duration_ms"], 120_000);
    assert!(all[2]["end"].is_null() && all[2]["exit_status"].is_null());
    let ids = |args: &[&str]| -> Vec<String> {
        sessions(args).iter().map(|s| s["session"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&["--session", "s2"]), ["s2"]);
    assert_eq!(ids(&["--since", "2026-07-24T20:00:00Z"]), ["s2", "s3"]);
    assert_eq!(ids(&["--until", "2026-07-25"]), ["s1", "s2"]);
    // The table: exit code, end reason, or `open`.
    let table = w.airlock(&repo).args(["logs", "sessions"]).run().expect_code(0).stdout();
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("SESSION") && rows[0].contains("EXIT"), "{table}");
    assert!(rows[1].contains("2m03s") && rows[1].contains("claude -p hi"), "{table}");
    assert!(rows[2].contains("supervisor_lost"), "{table}");
    assert!(rows[3].contains("open") && rows[3].contains("codex"), "{table}");
    // `--repo-name sessions` is the repo, and the listing is of its audit lines (none).
    let run = w.airlock(w.tmp.path()).args(["logs", "--repo-name", "sessions"]).run();
    let run = run.expect_code(0);
    assert_eq!(data_rows(&run.stdout()).len(), 0, "{}", run.stdout());
    assert!(run.stderr().contains("no matching entries"), "{}", run.stderr());
    let by_name = w.airlock(w.tmp.path()).args(["logs", "sessions", "--repo-name", "sessions"]);
    assert_eq!(data_rows(&by_name.run().expect_code(0).stdout()).len(), 3);
}

/// `[logs] keep`, applied by the daemon when a session starts: whole dated files older than
/// the window go; a file an unsettled journal entry needs stays until that entry is settled;
/// journals (a live writer's, with an entry in flight) are never deleted.
#[cfg(feature = "test-hooks")] // the test-only `airlock __audit-hold`
#[test]
fn retention_deletes_old_dated_files_only_and_keeps_journals() {
    use crate::harness::{Harness, Options};
    let w = World::new();
    let repo = w.repo("kept");
    w.write(
        w.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[logs]\nkeep = \"2d\"\n",
    );
    let dir = logs_dir(&w, "kept");
    w.write(dir.join(".repo-path"), &repo_path_text(&repo));
    let day = |days_ago: u64| utc_date(SystemTime::now() - Duration::from_secs(days_ago * 86_400));
    let old_line = "{\"note\":\"old\"}\n";
    for name in [
        "audit-2020-01-01.jsonl".to_owned(),
        "sessions-2020-01-01.jsonl".to_owned(),
        "audit-2020-01-02.jsonl".to_owned(),
        format!("audit-{}.jsonl", day(4)),
        format!("sessions-{}.jsonl", day(1)),
        format!("audit-{}.jsonl", day(1)),
    ] {
        w.write(dir.join(name), old_line);
    }
    // A live writer with a tunnel in flight.
    let mut child = KillOnDrop(
        Command::new(bin("airlock"))
            .args(["__audit-hold", "--boot", "liveboot", "--open", "1", "--log-dir"])
            .arg(&dir)
            .env_clear()
            .env("HOME", &w.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rx = line_reader(&mut child.0);
    let held = rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap(), "ready");
    let h = Harness::start(&w, Options::default());
    let up = w.airlock(&repo).env("AIRLOCK_SOCKET", h.socket()).args(["status"]).run();
    up.expect_code(0);
    // A dead writer's journal with an entry of 2020-01-02 still open, written once the live
    // writer and the daemon have started (each settles dead journals as it starts).
    let mut pending = AuditLine { ts: "2020-01-02T10:00:00.000Z".into(), ..allowed_template() };
    pending.id = "dead-1".into();
    let rec = airlock::audit::JournalRecord::Open { id: "dead-1".into(), line: Box::new(pending) };
    let rec = format!("{}\n", serde_json::to_string(&rec).unwrap());
    w.write(dir.join("journal-deadboot.jsonl"), &rec);
    let session = || {
        let run = w.airlock(&repo).env("AIRLOCK_SOCKET", h.socket()).args(["exec", "--", "true"]);
        let run = run.run();
        assert_eq!(run.code(), 0, "{}\n{}", run.stderr(), h.log());
    };
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };

    // First session: 2020-01-01 goes; 2020-01-02 and later are needed by the open entry.
    session();
    let now = names();
    assert!(!now.contains(&"audit-2020-01-01.jsonl".to_owned()), "{now:?}");
    assert!(!now.contains(&"sessions-2020-01-01.jsonl".to_owned()), "{now:?}");
    assert!(now.contains(&"audit-2020-01-02.jsonl".to_owned()), "{now:?}");
    assert!(now.contains(&format!("audit-{}.jsonl", day(4))), "{now:?}");
    // That session's start settled the dead journal (after retention ran).
    assert!(!now.contains(&"journal-deadboot.jsonl".to_owned()), "{now:?}");
    let settled = std::fs::read_to_string(today_file(&dir)).unwrap();
    assert!(settled.contains("\"id\":\"dead-1\"") && settled.contains("interrupted"), "{settled}");

    // Second session: nothing holds the old days any more.
    session();
    let now = names();
    assert!(!now.contains(&"audit-2020-01-02.jsonl".to_owned()), "{now:?}");
    assert!(!now.contains(&format!("audit-{}.jsonl", day(4))), "{now:?}");
    for kept in [
        format!("audit-{}.jsonl", day(1)),
        format!("sessions-{}.jsonl", day(1)),
        format!("audit-{}.jsonl", day(0)),
        format!("sessions-{}.jsonl", day(0)),
        "journal-liveboot.jsonl".to_owned(),
        ".repo-path".to_owned(),
    ] {
        assert!(now.contains(&kept), "{kept} was deleted: {now:?}");
    }
    // The live writer's tunnel is still shown in flight.
    let shown = w.airlock(&repo).args(["logs", "--json", "--allowed"]).run().expect_code(0);
    assert!(shown.stdout().contains(&held), "{}", shown.stdout());
    drop(child);
}

#[cfg(feature = "test-hooks")]
fn allowed_template() -> AuditLine {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileAuditSink::open(dir.path(), "tmpl", info("kept")).unwrap();
    let mut l = sink.line("pending.example", Some(443), "CONNECT");
    l.allowed = true;
    l
}

/// `[logs] keep` belongs to the managed and user layers: a repo file setting it is an error at
/// its file, line and column (so a repo cannot erase its own trail); nonsense is too.
#[test]
fn logs_keep_in_a_repo_file_or_nonsense_is_a_config_error_with_its_position() {
    let w = World::new();
    let repo = w.repo("keeper");
    w.write(repo.join(".airlock.toml"), "[network]\nallow = [\"a.test\"]\n[logs]\nkeep = \"1d\"\n");
    let run = w.airlock(&repo).args(["policy", "show"]).run();
    let out = run.stdout() + &run.stderr();
    let at = format!(
        "{}:3:2: [logs] is not allowed in the repo layer",
        repo.join(".airlock.toml").display()
    );
    assert!(out.contains(&at), "{out}");
    w.write(
        w.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"a.test\"]\n[logs]\nkeep = \"3 months\"\n",
    );
    let run = w.airlock(&repo).args(["policy", "show"]).run();
    let out = run.stdout() + &run.stderr();
    assert!(
        out.contains("config.toml:4:8: logs.keep: \"3 months\" is not a retention period"),
        "{out}"
    );
}
