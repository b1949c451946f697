//! `airlock publish` under crashes and overload (issue 16), with real components only: a real
//! `airlockd review` on loopback and real `airlock publish` child processes. A publish
//! `kill -9`ed again and again (with lines appended between runs) and then resumed; a server
//! that answers 429 under a concurrent load; an embedded store locked by another process (503);
//! the server itself `kill -9`ed mid-publish and restarted on the same port and store; and the
//! documented "personal review plane in two commands" on 127.0.0.44:8443. Each ends with the
//! server's events equal, per source and id, to the complete lines on disk. Durations only steer
//! the tests (when to kill); nothing asserts on timing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::publish::{claude_ids, codex_ids};
use crate::review_support::{Server, StoreSel, all_events, curl, token_for, user_with_token};
use crate::support::{Run, TestCommand, World, airlock_stdin, have};

/// A uniform number in [0, 1).
fn unit() -> f64 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

/// Complete lines of a log file, parsed.
fn log_lines(bytes: &[u8]) -> Vec<Value> {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .filter(|l| l.ends_with(b"\n"))
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// Every regular file below `dir` (recursively), sorted.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(walk(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

fn append(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// `GET /metrics` (from loopback, no token) as `series → value`.
fn metrics(base: &str) -> BTreeMap<String, f64> {
    let r = curl(&[&format!("{base}/metrics")]);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn metric(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

/// Items the server has stored as `created` since it started (every user).
fn created_on_server(base: &str) -> u64 {
    metric(&metrics(base), "airlock_review_ingest_items_total{status=\"created\"}") as u64
}

/// The events one user has on the server, fetched incrementally: `GET /api/v1/events` pages
/// are keyset on `pk`, so each refresh reads only what arrived since the last one.
#[derive(Default)]
struct Stored {
    after: Option<String>,
    ids: BTreeSet<(String, String)>,
    events: u64,
}

impl Stored {
    fn refresh(&mut self, base: &str, token: &str) -> u64 {
        loop {
            let mut path = "/api/v1/events?limit=1000".to_owned();
            if let Some(c) = &self.after {
                path.push_str(&format!("&cursor={c}"));
            }
            let r = crate::review_support::get(base, token, &path, &[]);
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            let page = v["events"].as_array().unwrap();
            for e in page {
                let key = (
                    e["source"].as_str().unwrap().to_owned(),
                    e["id"].as_str().unwrap().to_owned(),
                );
                assert!(self.ids.insert(key.clone()), "stored twice: {key:?}");
                self.events += 1;
            }
            match page.last() {
                Some(last) => self.after = Some(last["pk"].to_string()),
                None => break,
            }
            if v["next_cursor"].is_null() {
                break;
            }
        }
        self.events
    }

    fn has(&self, source: &str, id: &str) -> bool {
        self.ids.contains(&(source.to_owned(), id.to_owned()))
    }
}

/// One developer: a World, a member's token on the shared store, a repo `app` with its log
/// directory, logged in to a server once [`Dev::login`] ran.
struct Dev {
    world: World,
    token: String,
    repo: PathBuf,
    key: String,
    logs: PathBuf,
}

impl Dev {
    fn new(world: World, store: &StoreSel, email: &str) -> Self {
        let token = user_with_token(&world, store, email, "member");
        let repo = world.repo("app");
        let canon = std::fs::canonicalize(&repo).unwrap();
        let key = airlock::audit::logdir::repo_key("app", &canon);
        let logs = airlock::audit::logdir::claim(&world.home.join(".airlock/logs"), "app", &canon)
            .unwrap();
        Dev { world, token, repo, key, logs }
    }

    fn login(&self, base: &str) {
        airlock_stdin(
            &self.world,
            self.world.tmp.path(),
            &["login", "--server", base, "--token-stdin"],
            &format!("{}\n", self.token),
        )
        .expect_code(0);
    }

    fn projects(&self) -> PathBuf {
        self.world.home.join(".airlock/agent/claude").join(&self.key).join(".claude/projects")
    }

    fn codex_home(&self) -> PathBuf {
        self.world.home.join(".airlock/agent/codex").join(&self.key).join(".codex")
    }

    fn publish_cmd(&self, args: &[&str]) -> TestCommand {
        self.world.airlock(&self.repo).args(["publish"]).args(args)
    }

    /// `airlock publish --json`, expecting exit 0; the parsed report.
    fn publish_json(&self) -> Value {
        let run = self.publish_cmd(&["--json"]).run();
        assert_eq!(run.code(), 0, "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
        serde_json::from_str(run.stdout().trim())
            .unwrap_or_else(|e| panic!("{e}: {}", run.stdout()))
    }

    /// `airlock publish --json` as a child process; its stdout and stderr go to files in the
    /// world (returned as `(child, stdout, stderr)`).
    fn spawn_publish(&self, n: usize) -> (Child, PathBuf, PathBuf) {
        let out = self.world.tmp.path().join(format!("publish-{n}.stdout"));
        let err = self.world.tmp.path().join(format!("publish-{n}.stderr"));
        let mut cmd = self.publish_cmd(&["--json"]).cmd;
        cmd.stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        (cmd.spawn().unwrap(), out, err)
    }

    /// Writes the corpus: `days` dated audit and sessions files of `per_file` lines each,
    /// `days` Claude transcripts (every 7th line without a `uuid`), a subagent file, and a Codex
    /// rollout; about `4 * days * per_file` lines in all.
    fn generate(&self, days: usize, per_file: usize) {
        let pad = "x".repeat(120);
        for d in 1..=days {
            let mut audit = String::new();
            for n in 0..per_file {
                audit.push_str(&audit_line(d, n, &pad));
            }
            append(&self.logs.join(format!("audit-2026-03-{d:02}.jsonl")), audit.as_bytes());
            let mut sessions = String::new();
            for n in 0..per_file / 2 {
                sessions.push_str(&session_line(&format!("sess-{d}-{n}"), "start"));
                sessions.push_str(&session_line(&format!("sess-{d}-{n}"), "end"));
            }
            append(&self.logs.join(format!("sessions-2026-03-{d:02}.jsonl")), sessions.as_bytes());
            let mut claude = String::new();
            for n in 0..per_file {
                claude.push_str(&claude_line(&format!("c{d}"), n, &pad));
            }
            append(&self.projects().join(format!("-work-app/c{d}.jsonl")), claude.as_bytes());
        }
        let mut sub = String::new();
        for n in 0..per_file / 4 {
            let mut v: Value = serde_json::from_str(&claude_line("sub", n, &pad)).unwrap();
            v["isSidechain"] = json!(true);
            sub.push_str(&format!("{v}\n"));
        }
        append(&self.projects().join("-work-app/c1/subagents/agent-1.jsonl"), sub.as_bytes());
        let mut codex = format!(
            "{}\n",
            json!({"timestamp": "2026-03-04T10:00:00.000Z", "type": "session_meta",
                   "payload": {"id": "0195-codex-robust", "cwd": "/work/app"}})
        );
        for n in 0..per_file * days / 2 {
            codex.push_str(&codex_line(n, &pad));
        }
        append(&self.codex_rollout(), codex.as_bytes());
    }

    fn codex_rollout(&self) -> PathBuf {
        self.codex_home().join("sessions/2026/03/04/rollout-2026-03-04T10-00-00-robust.jsonl")
    }

    /// The source and ids of the complete lines of `bytes` (a file of this world at `path`), as
    /// publish derives them; `None` for a file publish does not read.
    fn ids_of(&self, path: &Path, bytes: &[u8]) -> Option<(&'static str, Vec<String>)> {
        let name = path.file_name()?.to_str()?;
        if !name.ends_with(".jsonl") {
            return None;
        }
        if path.parent() == Some(self.logs.as_path()) {
            let lines = log_lines(bytes);
            if name.starts_with("audit-") {
                return Some((
                    "egress",
                    lines.iter().map(|l| l["id"].as_str().unwrap().into()).collect(),
                ));
            }
            if name.starts_with("sessions-") {
                let ids = lines.iter().map(|l| {
                    format!("{}:{}", l["session"].as_str().unwrap(), l["kind"].as_str().unwrap())
                });
                return Some(("session", ids.collect()));
            }
            return None;
        }
        if let Ok(rel) = path.strip_prefix(self.projects()) {
            return Some(("claude", claude_ids(&rel.to_string_lossy(), bytes)));
        }
        let codex = self.codex_home();
        if path.starts_with(codex.join("sessions")) {
            let rel = path.strip_prefix(&codex).unwrap().to_string_lossy().into_owned();
            return Some(("codex", codex_ids(&rel, bytes)));
        }
        None
    }

    /// The ids the complete lines on disk must have on the server, per source.
    fn expected(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let files = [walk(&self.logs), walk(&self.projects()), walk(&self.codex_home())].concat();
        for f in files {
            if let Some((source, ids)) = self.ids_of(&f, &std::fs::read(&f).unwrap()) {
                out.entry(source.into()).or_default().extend(ids);
            }
        }
        out
    }

    fn expected_total(&self) -> u64 {
        self.expected().values().map(|v| v.len() as u64).sum()
    }

    /// Checks `state.json` after a kill: it parses (it is replaced atomically), every offset
    /// ends a complete line, and every line before an offset is stored on the server (the
    /// state only ever records what the server acknowledged). Returns the lines it covers.
    fn check_state(&self, stored: &Stored) -> u64 {
        let path = self.world.home.join(".airlock/publish/state.json");
        let Ok(bytes) = std::fs::read(&path) else { return 0 };
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "state.json does not parse after a kill ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        let files = v["files"].as_object().expect("state.json has files");
        let mut n = 0u64;
        for (file, st) in files {
            let off = usize::try_from(st["offset"].as_u64().unwrap()).unwrap();
            let data = std::fs::read(file).unwrap();
            assert!(off <= data.len(), "{file}: state offset {off} past its end");
            assert!(off == 0 || data[off - 1] == b'\n', "{file}: offset {off} is mid-line");
            let (source, ids) = self.ids_of(Path::new(file), &data[..off]).unwrap();
            let missing: Vec<&String> = ids.iter().filter(|id| !stored.has(source, id)).collect();
            assert!(
                missing.is_empty(),
                "state.json says {file} is acknowledged to {off}, but the server lacks {} of its \
                 lines, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(3)]
            );
            n += ids.len() as u64;
        }
        n
    }

    /// Asserts the server holds exactly the complete lines on disk: per source the id set,
    /// each id once, nothing else; and that `rejected.jsonl` names none of them.
    fn assert_exact(&self, base: &str) {
        let want = self.expected();
        for source in ["egress", "session", "claude", "codex"] {
            let events = all_events(base, &self.token, &format!("&source={source}"));
            let got: Vec<String> =
                events.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
            let got_set: BTreeSet<&String> = got.iter().collect();
            assert_eq!(got_set.len(), got.len(), "{source}: an id is stored twice");
            let want_ids = want.get(source).cloned().unwrap_or_default();
            let want_set: BTreeSet<&String> = want_ids.iter().collect();
            assert_eq!(want_set.len(), want_ids.len(), "{source}: the corpus repeats an id");
            let missing: Vec<_> = want_set.difference(&got_set).take(5).collect();
            let extra: Vec<_> = got_set.difference(&want_set).take(5).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{source}: {} on the server, {} on disk; missing e.g. {missing:?}, extra e.g. \
                 {extra:?}",
                got.len(),
                want_ids.len()
            );
        }
        let rejected = self.world.home.join(".airlock/publish/rejected.jsonl");
        let text = std::fs::read_to_string(&rejected).unwrap_or_default();
        assert!(text.trim().is_empty(), "rejected.jsonl has entries:\n{text}");
    }
}

fn audit_line(day: usize, n: usize, pad: &str) -> String {
    format!(
        "{}\n",
        json!({"id": format!("a{day}-{n}"), "ts": format!("2026-03-{day:02}T10:00:00.000Z"),
               "session": format!("sess-{day}-0"), "boot": "boot-1", "seq": n + 1,
               "user_id": "local-user", "repo": "app", "host": format!("h{n}.example.test"),
               "port": 443, "method": "CONNECT", "allowed": true, "reason": "allowed",
               "duration_ms": 3, "note": pad})
    )
}

fn session_line(session: &str, kind: &str) -> String {
    format!(
        "{}\n",
        json!({"kind": kind, "ts": "2026-03-04T10:00:00.000Z", "session": session,
               "boot": "boot-1", "repo": "app", "user_id": "local-user"})
    )
}

/// A Claude line; every 7th has no `uuid` (a `summary`, id by offset).
fn claude_line(file: &str, n: usize, pad: &str) -> String {
    let v = if n % 7 == 6 {
        json!({"type": "summary", "summary": format!("summary {n} {pad}"),
               "leafUuid": format!("{file}-u{}", n - 1)})
    } else {
        json!({"type": if n.is_multiple_of(2) { "user" } else { "assistant" },
               "uuid": format!("{file}-u{n}"), "sessionId": file,
               "timestamp": "2026-03-04T10:00:00.000Z",
               "message": {"role": "user", "content": format!("line {n} {pad}")}})
    };
    format!("{v}\n")
}

fn codex_line(n: usize, pad: &str) -> String {
    format!(
        "{}\n",
        json!({"timestamp": "2026-03-04T10:00:01.000Z", "type": "response_item",
               "payload": {"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": format!("{n} {pad}")}]}})
    )
}

/// Lines appended between two kills: audit lines, Claude lines (some uuid-less), Codex lines,
/// a new dated file at round 2, a partial last line at round 3 completed at round 4.
fn grow(dev: &Dev, round: usize) {
    let pad = "y".repeat(60);
    let mut audit = String::new();
    for n in 0..40 {
        audit.push_str(&audit_line(1, 100_000 + round * 1000 + n, &pad));
    }
    append(&dev.logs.join("audit-2026-03-01.jsonl"), audit.as_bytes());
    let mut claude = String::new();
    for n in 0..21 {
        claude.push_str(&claude_line(&format!("grow{round}"), n, &pad));
    }
    append(&dev.projects().join("-work-app/c1.jsonl"), claude.as_bytes());
    let mut codex = String::new();
    for n in 0..10 {
        codex.push_str(&codex_line(round * 1000 + n, &pad));
    }
    append(&dev.codex_rollout(), codex.as_bytes());
    let partial = dev.projects().join("-work-app/partial.jsonl");
    match round {
        2 => {
            let rotated = dev.logs.join("audit-2026-03-20.jsonl");
            append(&rotated, audit_line(20, 0, &pad).as_bytes());
            append(
                &dev.logs.join("sessions-2026-03-20.jsonl"),
                session_line("s20", "start").as_bytes(),
            );
        }
        3 => {
            append(&partial, claude_line("partial", 0, &pad).as_bytes());
            let half = claude_line("partial", 1, &pad);
            append(&partial, &half.as_bytes()[..half.len() / 2]);
        }
        4 => {
            let half = claude_line("partial", 1, &pad);
            append(&partial, &half.as_bytes()[half.len() / 2..]);
        }
        _ => {}
    }
}

fn kill_iterations() -> usize {
    match std::env::var("AIRLOCK_TEST_KILL_ITERATIONS") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("AIRLOCK_TEST_KILL_ITERATIONS={v:?}")),
        Err(_) => 8,
    }
}

/// The corpus of the kill tests: about 28,500 lines (a publish of some seconds in a debug build).
const DAYS: usize = 4;
const PER_FILE: usize = 2_000;

#[test]
fn kill_9_mid_publish_in_a_loop_then_resume_gives_exact_server_counts() {
    let first = World::new();
    let store = StoreSel::Embedded(first.tmp.path().join("store"));
    let dev = Dev::new(first, &store, "dev@example.test");
    let server = Server::start(&dev.world, &store, &[]);
    dev.login(&server.base);
    dev.generate(DAYS, PER_FILE);

    let mut stored = Stored::default();
    let mut landed_mid = 0usize;
    let mut log = Vec::new();
    for i in 0..kill_iterations() {
        let total = dev.expected_total();
        let before = stored.refresh(&server.base, &dev.token);
        let (mut child, _, err) = dev.spawn_publish(i);
        let started = Instant::now();
        // Two kinds of kill, both at random points: by progress (once the server has stored a
        // random share of what is left, plus up to 150 ms: mid-batch, mid-answer, mid-state
        // write), and by time (within the first second: discovery, reading, the first post).
        let how = if i % 2 == 0 {
            let target = before + ((0.1 + 0.8 * unit()) * (total - before) as f64) as u64;
            // `/metrics` (no store access): reads of the events wait for the store.
            while child.try_wait().unwrap().is_none() && created_on_server(&server.base) < target {
                std::thread::sleep(Duration::from_millis(25));
            }
            std::thread::sleep(Duration::from_millis((150.0 * unit()) as u64));
            format!("at {target}+")
        } else {
            std::thread::sleep(Duration::from_millis((50.0 + 950.0 * unit()) as u64));
            "by time".to_owned()
        };
        // What the server had stored when the signal went (batches in flight may still land).
        let at_kill = created_on_server(&server.base);
        let killed = match child.try_wait().unwrap() {
            Some(status) => {
                assert!(
                    status.success(),
                    "{status}: {}",
                    std::fs::read_to_string(&err).unwrap_or_default()
                );
                false
            }
            None => {
                child.kill().unwrap(); // SIGKILL
                let status = child.wait().unwrap();
                use std::os::unix::process::ExitStatusExt;
                // It may have finished in the instant before the signal.
                status.signal() == Some(9)
            }
        };
        let ran = started.elapsed();
        let on_server = stored.refresh(&server.base, &dev.token);
        let acked = dev.check_state(&stored);
        let mid = killed && at_kill > before && at_kill < total;
        landed_mid += usize::from(mid);
        log.push(format!(
            "#{i}: killed {how} after {ran:?}: {killed}, server {before}->{at_kill} at the \
             kill, {on_server} after, of {total}; state {acked}"
        ));
        grow(&dev, i);
    }
    eprintln!("kill loop:\n{}", log.join("\n"));
    assert!(
        landed_mid > 0,
        "no kill landed mid-publish, the test proved nothing:\n{}",
        log.join("\n")
    );

    let r = dev.publish_json();
    assert_eq!(r["rejected"], 0, "{r}");
    assert_eq!(r["conflict"], 0, "{r}");
    dev.assert_exact(&server.base);
    // `/metrics` counted every stored item, those of requests whose client was killed too.
    assert_eq!(
        created_on_server(&server.base),
        dev.expected_total(),
        "items stored but not counted in /metrics"
    );
    // Nothing left: a further run reads nothing.
    let r = dev.publish_json();
    assert_eq!((r["files"].as_u64(), r["created"].as_u64()), (Some(0), Some(0)), "{r}");
}

/// One `POST /api/v1/events` over a fresh TCP connection; the status (0: the connection
/// failed or was cut).
fn post_raw(port: u16, token: &str, body: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return 0 };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer \
         {token}\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n",
        body.len()
    );
    // A refusal may come before the body is read and close the connection.
    let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(body));
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn a_429_from_a_loaded_server_is_waited_out_and_nothing_is_lost() {
    if !have("curl") {
        return;
    }
    let first = World::new();
    let store = StoreSel::Embedded(first.tmp.path().join("store"));
    let dev = Dev::new(first, &store, "dev@example.test");
    // Two load users with three tokens each.
    let load_world = World::new();
    let load: Vec<String> = ["load1@example.test", "load2@example.test"]
        .iter()
        .flat_map(|email| {
            let t = user_with_token(&load_world, &store, email, "member");
            [t, token_for(&load_world, &store, email), token_for(&load_world, &store, email)]
        })
        .collect();
    let server = Server::start(
        &dev.world,
        &store,
        &[
            "--ingest-concurrency",
            "3",
            "--ingest-concurrency-per-user",
            "2",
            "--rate-limit-per-token",
            "1",
            "--rate-limit-burst",
            "1",
        ],
    );
    dev.login(&server.base);
    dev.generate(2, 1_000);

    // The load: one thread per token, posting 250-item batches as fast as it is let, for a
    // bounded burst (at most LOAD_POSTS each). A server kept full for good makes publish give
    // up after its capped attempts (~90 s of backoff per batch; it says so and resumes next
    // time): on a slow CI machine an unbounded load did exactly that. The 429s come from the
    // slots being full, not from the work per batch, so batches are kept small: on a slow CI
    // machine (debug build) 1000-item batches kept one of publish's requests waiting past
    // its 120 s answer timeout.
    const LOAD_POSTS: u64 = 8;
    const LOAD_ITEMS: u64 = 250;
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<std::sync::Mutex<BTreeMap<u16, u64>>> = Arc::default();
    let sent = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for (t, token) in load.iter().enumerate() {
        let (stop, statuses, sent) = (stop.clone(), statuses.clone(), sent.clone());
        let (token, port) = (token.clone(), server.port);
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) && n < LOAD_POSTS {
                let mut body = Vec::new();
                for i in 0..LOAD_ITEMS {
                    let id = format!("load-{t}-{n}-{i}");
                    let v = crate::review_support::egress(&id, "load.example.test", true);
                    body.extend_from_slice(format!("{v}\n").as_bytes());
                }
                let code = post_raw(port, &token, &body);
                *statuses.lock().unwrap().entry(code).or_default() += 1;
                sent.fetch_add(1, Ordering::SeqCst);
                n += 1;
                if code == 429 {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }));
    }
    assert!(
        crate::support::wait_until(Duration::from_secs(30), || sent.load(Ordering::SeqCst) >= 6)
    );

    let r = dev.publish_json();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let statuses = statuses.lock().unwrap().clone();
    eprintln!("publish: {r}\nload answers: {statuses:?}");
    assert!(r["retried"].as_u64().unwrap() > 0, "publish never had to wait: {r}");
    assert_eq!(r["rejected"], 0, "{r}");
    assert_eq!(r["created"].as_u64(), Some(dev.expected_total()), "{r}");
    assert!(
        statuses.get(&207).or(statuses.get(&200)).is_some_and(|n| *n > 0),
        "the load stored nothing: {statuses:?}"
    );
    let m = metrics(&server.base);
    let limited: f64 = ["token", "ingest_global", "ingest_per_user"]
        .iter()
        .map(|l| metric(&m, &format!("airlock_review_rate_limited_total{{limit=\"{l}\"}}")))
        .sum();
    assert!(limited >= r["retried"].as_f64().unwrap(), "429s counted in /metrics: {limited}, {r}");
    assert!(metric(&m, "airlock_review_ingest_requests_total{code=\"429\"}") > 0.0, "{m:?}");
    // Read back through a server on the same store without the tight limits (the reads would
    // be rate limited too).
    drop(server);
    let server = Server::start(&dev.world, &store, &[]);
    dev.assert_exact(&server.base);
}

/// Another process (python3's sqlite3) holding an exclusive transaction on an embedded store's
/// database until [`SqliteLock::release`] (or until its stdin closes, if the test fails).
struct SqliteLock {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl SqliteLock {
    /// Returns once the lock is held.
    fn take(db: &Path) -> Self {
        let script = "import sqlite3, sys\n\
                      con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n\
                      con.execute('BEGIN EXCLUSIVE')\n\
                      print('locked', flush=True)\n\
                      sys.stdin.readline()\n\
                      con.execute('ROLLBACK')\n\
                      print('released', flush=True)\n";
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", script])
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "locked", "python did not take the lock");
        SqliteLock { child, out }
    }

    fn release(mut self) {
        let mut stdin = self.child.stdin.take().unwrap();
        writeln!(stdin).unwrap();
        drop(stdin);
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "released");
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn a_503_while_the_store_is_locked_is_retried_until_it_frees() {
    if !have("python3") || !have("curl") {
        return;
    }
    let first = World::new();
    let dir = first.tmp.path().join("store");
    let store = StoreSel::Embedded(dir.clone());
    let dev = Dev::new(first, &store, "dev@example.test");
    let server = Server::start(&dev.world, &store, &[]);
    dev.login(&server.base);
    dev.generate(1, 200);
    let db = dir.join("review.db");
    assert!(db.is_file(), "the embedded store's database: {}", db.display());

    // Another process holds an exclusive transaction on the database until told to let go:
    // the server's writes wait out their busy timeout and answer 503.
    let lock = SqliteLock::take(&db);
    let (mut child, out_path, err) = dev.spawn_publish(0);
    // Let go once the server has answered a 503 (the lock was held when publish posted).
    let saw_503 = crate::support::wait_until(Duration::from_secs(60), || {
        metric(&metrics(&server.base), "airlock_review_ingest_requests_total{code=\"503\"}") >= 1.0
    });
    lock.release();
    assert!(saw_503, "the server never answered 503 while the store was locked:\n{}", server.log());

    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    let r: Value = serde_json::from_str(std::fs::read_to_string(&out_path).unwrap().trim())
        .unwrap_or_else(|e| panic!("{e}: {stderr}"));
    eprintln!("publish while the store was locked: {r}");
    assert!(r["retried"].as_u64().unwrap() >= 1, "publish never waited: {r}");
    assert_eq!(r["rejected"], 0, "{r}");
    let m = metrics(&server.base);
    assert!(metric(&m, "airlock_review_store_errors_total{kind=\"unavailable\"}") >= 1.0);
    dev.assert_exact(&server.base);
}

/// A lock held for less than the store's busy timeout (5 s) is waited for: the ingest is
/// answered once it frees, not 503 at once. (Regression: ingest's transaction began deferred,
/// read, then upgraded to write; SQLite does not run the busy handler for that upgrade, so any
/// other writer, an `airlockd admin` command say, turned ingest into an immediate 503.)
#[test]
fn a_store_locked_for_less_than_the_busy_timeout_is_waited_for() {
    if !have("python3") || !have("curl") {
        return;
    }
    let world = World::new();
    let dir = world.tmp.path().join("store");
    let store = StoreSel::Embedded(dir.clone());
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let body = crate::review_support::write_file(
        world.tmp.path(),
        "b.ndjson",
        &crate::review_support::ndjson(&[crate::review_support::egress(
            "w1",
            "example.test",
            true,
        )]),
    );
    let lock = SqliteLock::take(&dir.join("review.db"));
    let (base, tok) = (server.base.clone(), token.clone());
    let post = std::thread::spawn(move || {
        crate::review_support::post_events(&base, &tok, &body, "application/x-ndjson", &[])
    });
    // Let go once the request is inside the ingest (its slot taken), or answered already.
    crate::support::wait_until(Duration::from_secs(30), || {
        post.is_finished()
            || metric(&metrics(&server.base), "airlock_review_slots_in_use{kind=\"ingest\"}") >= 1.0
    });
    lock.release();
    let r = post.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}\n{}", server.log());
    assert_eq!(all_events(&server.base, &token, "").len(), 1);
}

#[test]
fn the_server_killed_mid_publish_stops_with_a_clear_error_and_resumes() {
    let first = World::new();
    let store = StoreSel::Embedded(first.tmp.path().join("store"));
    let dev = Dev::new(first, &store, "dev@example.test");
    let mut server = Server::start(&dev.world, &store, &[]);
    dev.login(&server.base);
    dev.generate(DAYS, PER_FILE);
    let total = dev.expected_total();

    let (mut child, _, err) = dev.spawn_publish(0);
    // Kill the server once it has stored something, while the publish runs.
    let progressed =
        crate::support::wait_until(Duration::from_secs(60), || created_on_server(&server.base) > 0);
    assert!(progressed, "the publish never got anything stored");
    assert!(child.try_wait().unwrap().is_none(), "the publish finished before the server died");
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(!status.success(), "publish succeeded with its server killed: {stderr}");
    assert!(stderr.contains("run `airlock publish` again"), "{stderr}");
    eprintln!("publish with its server killed: {status}: {stderr}");
    let port = server.port;
    drop(server);
    let server = Server::start_on(&dev.world, &store, &[], port);
    // What the state records is on the server (a batch in flight when it died is not).
    let mut stored = Stored::default();
    let stored_n = stored.refresh(&server.base, &dev.token);
    let acked = dev.check_state(&stored);
    assert!(acked < total, "state.json claims everything: {acked}/{total}");
    let r = dev.publish_json();
    assert_eq!(r["rejected"], 0, "{r}");
    assert_eq!(r["created"].as_u64().unwrap() + stored_n, total, "{r}");
    dev.assert_exact(&server.base);
}

/// The documented flow (docs/review.md "A personal review plane"): `review init` prints the
/// token on stdout and the login line on stderr; the plane listens on 127.0.0.44:8443; the
/// token is piped into that login line; whoami, a real session, publish.
#[test]
fn a_personal_review_plane_in_two_commands() {
    use crate::harness::{Harness, Options};
    if !have("curl") {
        return;
    }
    const ADDR: &str = "127.0.0.44:8443";
    if let Err(e) = std::net::TcpListener::bind(ADDR) {
        panic!("{ADDR} is busy ({e}): this test needs the personal review plane's address free");
    }
    let world = World::new();
    let dir = world.tmp.path().join("review");
    let run = world
        .airlockd(world.tmp.path())
        .args(["review", "init", "--admin", "you@example.test", "--data-dir"])
        .args([&dir])
        .run()
        .expect_code(0);
    let token = run.stdout().trim().to_owned();
    assert!(token.starts_with("alk_") && !token.contains('\n'), "stdout is the token: {token:?}");
    let stderr = run.stderr();
    assert!(!stderr.contains(&token), "the token must not be on stderr");
    let login_line = stderr
        .lines()
        .find_map(|l| l.find("airlock login ").map(|i| l[i..].trim().to_owned()))
        .unwrap_or_else(|| panic!("no login line on stderr:\n{stderr}"));
    assert_eq!(login_line, format!("airlock login --server http://{ADDR} --token-stdin"));

    // The plane (what `airlock service install --review` runs, started by hand here).
    let log = world.tmp.path().join("review.log");
    let mut server = Command::new(crate::support::bin("airlockd"))
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["review", "--listen", ADDR, "--data-dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Kill(&mut server);
    let up =
        crate::support::wait_until(Duration::from_secs(30), || TcpStream::connect(ADDR).is_ok());
    assert!(up, "the plane did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());

    // `airlockd review init … | airlock login …`: the token on the login line's stdin.
    let args: Vec<&str> = login_line.split_whitespace().skip(1).collect();
    let repo = world.repo("app");
    airlock_stdin(&world, &repo, &args, &run.stdout()).expect_code(0);
    let who = world.airlock(&repo).args(["whoami"]).run().expect_code(0);
    let out = format!("{}{}", who.stdout(), who.stderr());
    assert!(out.contains("you@example.test"), "{out}");
    assert!(out.contains("admin"), "{out}");

    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let h = Harness::start(&world, Options::default());
    let session: Run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "curl -s -o /dev/null -m 5 http://denied.test/; echo done",
        ])
        .run();
    assert_eq!(session.code(), 0, "{}\n{}\n{}", session.stdout(), session.stderr(), h.log());
    let dirs = world.home.join(".airlock/logs/app");
    let audit = crate::support::jsonl_lines(&dirs, "audit-");
    let records = crate::support::jsonl_lines(&dirs, "sessions-");
    assert!(!audit.is_empty() && records.len() == 2, "{audit:?} {records:?}");

    let run = world.airlock(&repo).args(["publish", "--json"]).run().expect_code(0);
    let r: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(r["created"].as_u64(), Some((audit.len() + records.len()) as u64), "{r}");
    let base = format!("http://{ADDR}");
    let egress = all_events(&base, &token, "&source=egress");
    let want: BTreeSet<&str> = audit.iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(egress.iter().map(|e| e["id"].as_str().unwrap()).collect::<BTreeSet<_>>(), want);
    assert_eq!(all_events(&base, &token, "&source=session").len(), records.len());
    drop(server);
}
