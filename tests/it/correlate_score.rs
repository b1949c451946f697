//! Replay and scoring of the correlate fixture corpus (issue 20), shared by the integration
//! test `correlate_replay` and the bench `correlate_quality` (included there with `#[path]`,
//! so it uses nothing but std, serde_json, toml and tempfile, and drives `airlockd` and curl
//! as processes).
//!
//! Each fixture `tests/fixtures/correlate/<scenario>.jsonl` holds one real session's events
//! as the review server's export returned them (server-specific members stripped); `labels.toml`
//! names, per scenario, its Airlock session, the correlate rules that must fire and those that
//! must not. [`replay`] starts a fresh loopback `airlockd review` (embedded store), posts each
//! fixture with a fresh token of its own user, waits for the flags the labels expect (polling
//! `GET /api/v1/flags`), and reports which correlate rules fired per scenario; [`score`] turns
//! that into per-rule and overall precision and recall.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long [`replay`] waits for every labelled positive before reading the flags as they are.
pub const WAIT: Duration = Duration::from_secs(60);

/// One labelled scenario of `labels.toml`.
#[derive(Debug, Clone)]
pub struct Labelled {
    pub name: String,
    pub what: String,
    pub session: String,
    pub expect: Vec<String>,
    pub absent: Vec<String>,
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/correlate")
}

/// The scenarios of `DIR/labels.toml`, in file order.
pub fn load_labels(dir: &Path) -> Vec<Labelled> {
    let path = dir.join("labels.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate: docs/testing.md)", path.display()));
    let doc: toml::Value =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let strs = |v: &toml::Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(|x| x.as_array())
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    doc["scenario"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Labelled {
            name: s["name"].as_str().unwrap().to_owned(),
            what: s.get("what").and_then(|w| w.as_str()).unwrap_or("").to_owned(),
            session: s["session"].as_str().unwrap().to_owned(),
            expect: strs(s, "expect"),
            absent: strs(s, "absent"),
        })
        .collect()
}

/// The events of `DIR/<name>.jsonl`, as envelopes ready for `POST /api/v1/events`.
pub fn load_fixture(dir: &Path, name: &str) -> Vec<Value> {
    let path = dir.join(format!("{name}.jsonl"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// Which correlate rules fired per scenario name, and whether every labelled positive showed
/// up before [`WAIT`] ran out.
#[derive(Debug)]
pub struct Replayed {
    pub fired: BTreeMap<String, BTreeSet<String>>,
    pub complete: bool,
    /// Every correlate flag, as listed (for diagnostics and link checks).
    pub flags: Vec<Value>,
    /// The server's log, for a failure message.
    pub log: String,
}

/// A loopback `airlockd review` on a fresh embedded store, killed on drop.
pub struct Review {
    child: Child,
    pub base: String,
    pub admin: String,
    airlockd: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Review {
    fn cmd(airlockd: &Path, home: &Path) -> Command {
        let mut c = Command::new(airlockd);
        c.env_clear()
            .env("HOME", home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null());
        c
    }

    fn out(mut c: Command) -> String {
        let o = c.output().unwrap();
        assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    /// A store with an admin and one member per email in `users` (their tokens, in order),
    /// then the server on it, with `extra` arguments (e.g. `--rules-dir`).
    pub fn start(airlockd: &Path, users: &[String], extra: &[&str]) -> (Self, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let data = dir.path().join("store");
        let data_s = data.display().to_string();
        let mut c = Self::cmd(airlockd, &home);
        c.args(["review", "init", "--admin", "admin@example.test", "--data-dir", &data_s]);
        let admin = Self::out(c);
        let mut tokens = Vec::new();
        for email in users {
            let mut c = Self::cmd(airlockd, &home);
            c.args(["admin", "user", "add", "--email", email, "--role", "member"])
                .args(["--data-dir", &data_s]);
            Self::out(c);
            let mut c = Self::cmd(airlockd, &home);
            c.args(["admin", "token", "create", "--user", email, "--data-dir", &data_s]);
            tokens.push(Self::out(c));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = dir.path().join("review.log");
        let mut c = Self::cmd(airlockd, &home);
        c.args(["review", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", &data_s])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = c.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "airlockd review exited {st}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "airlockd review did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let base = format!("http://127.0.0.1:{port}");
        (Self { child, base, admin, airlockd: airlockd.to_owned(), dir }, tokens)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("review.log")).unwrap_or_default()
    }

    /// `(status, body)` of a curl request to `path` with `token`.
    pub fn http(&self, token: &str, path: &str, body: Option<&Path>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-sS", "--noproxy", "*", "-o", "-", "-w", "\n%{http_code}"])
            .args(["-H", &format!("Authorization: Bearer {token}")]);
        if let Some(b) = body {
            c.args(["-H", "Content-Type: application/x-ndjson"])
                .args(["--data-binary", &format!("@{}", b.display())]);
        }
        c.arg(format!("{}{path}", self.base));
        let o = c.output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// Posts `events` (NDJSON, batches of at most 1,000) as `token`; every item must be
    /// created or a duplicate.
    pub fn post(&self, token: &str, events: &[Value]) {
        for batch in events.chunks(1000) {
            let body: String = batch.iter().map(|e| format!("{e}\n")).collect();
            let f = self.dir.path().join("batch.ndjson");
            std::fs::write(&f, body).unwrap();
            let (status, text) = self.http(token, "/api/v1/events", Some(&f));
            assert!(status == 200 || status == 207, "POST /api/v1/events: {status} {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            for it in v["results"].as_array().unwrap() {
                let st = it["status"].as_str().unwrap_or("");
                assert!(st == "created" || st == "duplicate", "item refused: {it}");
            }
        }
    }

    /// Every flag (all users), following cursors.
    pub fn flags(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = "/api/v1/flags?limit=1000".to_owned();
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (status, body) = self.http(&self.admin, &path, None);
            assert_eq!(status, 200, "GET /api/v1/flags: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            out.extend(v["flags"].as_array().unwrap().iter().cloned());
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        out
    }
}

impl Drop for Review {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The correlate rules fired per Airlock session among `flags`.
fn fired_by_session(flags: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in flags {
        let rule = f["rule_id"].as_str().unwrap_or("");
        if let (true, Some(s)) = (rule.starts_with("correlate."), f["session"].as_str()) {
            m.entry(s.to_owned()).or_default().insert(rule.to_owned());
        }
    }
    m
}

/// Replays every labelled fixture of `dir` into a fresh server (`extra`: its arguments, e.g.
/// `--rules-dir`), each as its own user, and collects the correlate flags.
pub fn replay(airlockd: &Path, dir: &Path, labels: &[Labelled], extra: &[&str]) -> Replayed {
    let users: Vec<String> =
        (0..labels.len()).map(|i| format!("fixture-{i}@example.test")).collect();
    let (server, tokens) = Review::start(airlockd, &users, extra);
    for (l, token) in labels.iter().zip(&tokens) {
        server.post(token, &load_fixture(dir, &l.name));
    }
    // The end record triggers the check; poll until every labelled positive is listed (the
    // negatives cannot be waited for: their end records were ingested before the last
    // positive's, which is the best evidence their checks ran).
    let want: BTreeSet<(String, String)> = labels
        .iter()
        .flat_map(|l| l.expect.iter().map(|r| (l.session.clone(), r.clone())))
        .collect();
    let deadline = Instant::now() + WAIT;
    let (flags, complete) = loop {
        let flags = server.flags();
        let fired = fired_by_session(&flags);
        let have = want.iter().all(|(s, r)| fired.get(s).is_some_and(|f| f.contains(r)));
        if have || Instant::now() > deadline {
            break (flags, have);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let by_session = fired_by_session(&flags);
    let fired = labels
        .iter()
        .map(|l| (l.name.clone(), by_session.get(&l.session).cloned().unwrap_or_default()))
        .collect();
    let flags = flags
        .into_iter()
        .filter(|f| f["rule_id"].as_str().is_some_and(|r| r.starts_with("correlate.")))
        .collect();
    Replayed { fired, complete, flags, log: server.log() }
}

/// One rule's confusion counts over the labelled scenarios.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuleScore {
    pub rule: String,
    pub tp: usize,
    pub fp: usize,
    pub fn_: usize,
    pub tn: usize,
}

impl RuleScore {
    /// `None` when the rule fired on no labelled scenario (precision undefined).
    pub fn precision(&self) -> Option<f64> {
        let d = self.tp + self.fp;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }
    /// `None` when no scenario expects the rule.
    pub fn recall(&self) -> Option<f64> {
        let d = self.tp + self.fn_;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }
}

/// Per-rule counts (in `rules` order) and the overall sum as the last row (`rule` = "all").
/// A scenario counts for a rule only where its labels name that rule (expected or absent).
pub fn score(
    rules: &[&str],
    labels: &[Labelled],
    fired: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<RuleScore> {
    let mut rows: Vec<RuleScore> =
        rules.iter().map(|r| RuleScore { rule: (*r).to_owned(), ..Default::default() }).collect();
    for l in labels {
        let got = fired.get(&l.name).cloned().unwrap_or_default();
        for row in rows.iter_mut() {
            let hit = got.contains(&row.rule);
            if l.expect.contains(&row.rule) {
                if hit { row.tp += 1 } else { row.fn_ += 1 }
            } else if l.absent.contains(&row.rule) {
                if hit { row.fp += 1 } else { row.tn += 1 }
            }
        }
    }
    let mut all = RuleScore { rule: "all".into(), ..Default::default() };
    for r in &rows {
        all.tp += r.tp;
        all.fp += r.fp;
        all.fn_ += r.fn_;
        all.tn += r.tn;
    }
    rows.push(all);
    rows
}

/// The scores as a Markdown table.
pub fn table(rows: &[RuleScore]) -> String {
    let f = |x: Option<f64>| x.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3}"));
    let mut s = String::from(
        "| Rule | Positives (found/all) | Negatives (clean/all) | Precision | Recall |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let name = if r.rule == "all" { "**all**".to_owned() } else { format!("`{}`", r.rule) };
        s.push_str(&format!(
            "| {name} | {}/{} | {}/{} | {} | {} |\n",
            r.tp,
            r.tp + r.fn_,
            r.tn,
            r.tn + r.fp,
            f(r.precision()),
            f(r.recall())
        ));
    }
    s
}
