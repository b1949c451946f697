//! `airlock publish` throughput and its no-change cost (issue 16), all in one run on loopback:
//!
//! 1. **Client side alone**: publish a corpus of mixed lines (egress audit lines, session
//!    records, Claude Code and Codex transcript lines; `BENCH_PUBLISH_MB`, default 1024) into a
//!    sink that stores nothing: read, frame, gzip. Bytes of lines per second.
//! 2. **The store's ingest rate** (the baseline): the exact gzipped batches that run produced,
//!    replayed to a fresh embedded store's `POST /api/v1/events` by one user with as many
//!    requests in flight as the server advertises (`X-Airlock-Ingest-Concurrency`), the way the
//!    `review_ingest` bench drives it: no client work between requests.
//! 3. **End to end**: the same corpus published to another fresh embedded store through the real
//!    review-plane client (`remote::Client`, the one `airlock publish` uses), same concurrency.
//! 4. **No change**: the real `airlock publish --all` binary over 1,000 already-published files,
//!    against `airlock --version` (process start, same run), interleaved.
//!
//! Targets: (3) ≥ 0.9× (2); (1) ≥ 3× (2); (4) ≤ 50 ms. Rates are bytes of source lines per
//! second (what `--json` calls `bytes`), the same numerator for all three.
//!
//! `cargo bench --bench publish` (env: BENCH_PUBLISH_MB, default 1024; BENCH_NOCHANGE_RUNS, 30).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::env::MapEnv;
use airlock::paths::Paths;
use airlock::publish::{self, NullSink, PublishOptions, Reply, Scope, Sink, SinkError};
use airlock::review::detect::Engine;
use airlock::review::limits::{LimitsConfig, Rate};
use airlock::review::server::{AppState, serve};
use airlock::review::store::sqlite::SqliteStore;
use airlock::review::store::{AnyStore, Store};
use airlock::review::{Role, token};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// A small deterministic generator (xorshift64*): the corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Prose-like text of about `len` bytes (compresses like transcripts do, not like zeros).
    fn text(&mut self, len: usize) -> String {
        const WORDS: [&str; 32] = [
            "the", "function", "returns", "error", "cargo", "test", "passes", "file", "src",
            "lib.rs", "we", "need", "to", "check", "whether", "config", "value", "is", "read",
            "before", "write", "lock", "state", "server", "client", "batch", "retry", "line",
            "offset", "hash", "parse", "fixed",
        ];
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            let w = WORDS[self.below(WORDS.len() as u64) as usize];
            s.push_str(w);
            s.push(if self.below(12) == 0 { '.' } else { ' ' });
        }
        s
    }
    fn text_between(&mut self, lo: usize, hi: usize) -> String {
        let len = lo + self.below((hi - lo) as u64) as usize;
        self.text(len)
    }
    fn hex(&mut self, n: usize) -> String {
        (0..n).map(|_| format!("{:x}", self.below(16))).collect()
    }
}

/// The corpus: a HOME with one repo's log directory and its Claude and Codex agent homes.
struct Corpus {
    _home: tempfile::TempDir,
    paths: Paths,
    bytes: u64,
    lines: u64,
}

fn paths_for(home: &Path) -> Paths {
    Paths::from_env(&MapEnv::new().with("HOME", home.as_os_str())).unwrap()
}

/// Writes about `target` bytes: 40% egress audit lines (~650 B), 45% Claude lines (~0.5–4 KB),
/// 15% Codex lines, plus one sessions file; files of ~32 MB, like a busy week of a repo.
fn make_corpus(target: u64) -> Corpus {
    let home = tempfile::tempdir().unwrap();
    let paths = paths_for(home.path());
    let repo_path = Path::new("/work/app");
    let logdir = airlock::audit::logdir::claim(&paths.logs_root(), "app", repo_path).unwrap();
    let key = airlock::audit::logdir::repo_key("app", repo_path);
    let agent = paths.airlock_dir().join("agent");
    let claude = agent.join("claude").join(&key).join(".claude/projects/-work-app");
    let codex = agent.join("codex").join(&key).join(".codex/sessions/2026/03/04");
    std::fs::create_dir_all(&claude).unwrap();
    std::fs::create_dir_all(&codex).unwrap();
    const FILE: u64 = 32 << 20;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut totals = (0u64, 0u64);
    let audit_total = target * 40 / 100;
    // One dated file per day (at most 28 in the month the names use).
    assert!(audit_total.div_ceil(FILE) <= 28, "BENCH_PUBLISH_MB too large for one month of files");
    for day in 0..audit_total.div_ceil(FILE) {
        let budget = FILE.min(audit_total - day * FILE);
        let boot = format!("boot-{day}");
        write_lines(
            &mut rng,
            &mut totals,
            logdir.join(format!("audit-2026-02-{:02}.jsonl", day % 28 + 1)),
            budget,
            |r, i| {
                let host = ["api.anthropic.com", "registry.npmjs.org", "crates.io", "pastebin.com"]
                    [r.below(4) as usize];
                let allowed = host != "pastebin.com";
                format!(
                    r#"{{"ts":"2026-02-{d:02}T09:{m:02}:{s:02}.118Z","v":1,"id":"{boot}:{i}","boot":"{boot}","seq":{seq},"session":"sess-{day}-{sn}","user_id":"41f0c2","repo":"app","kind":"connect","host":"{host}","port":443,"method":"CONNECT","allowed":{allowed},"policy":"team-default@4","rule":"allow api hosts","bytes_sent":{bs},"bytes_recv":{br},"duration_ms":{dm},"sni":"{host}","tls":"1.3","alpn":"http/1.1","pid":{pid},"exe":"/usr/local/bin/claude","ua":"claude-cli/2.1.40 (external, cli)","cwd":"/work/app","proc":"node"}}"#,
                    d = day % 28 + 1,
                    m = (i / 60) % 60,
                    s = i % 60,
                    seq = i + 1,
                    sn = i / 5000,
                    bs = r.below(100_000),
                    br = r.below(1_000_000),
                    dm = r.below(5000),
                    pid = 1000 + r.below(60_000),
                )
            },
        );
    }
    write_lines(
        &mut rng,
        &mut totals,
        logdir.join("sessions-2026-02-01.jsonl"),
        64 << 10,
        |r, i| {
            format!(
                r#"{{"ts":"2026-02-01T10:00:{s:02}.000Z","v":1,"kind":"end","id":"sess-0-{i}:end","session":"sess-0-{i}","user_id":"41f0c2","repo":"app","exit":0,"duration_ms":{d},"transcripts":[]}}"#,
                s = i % 60,
                d = r.below(3_600_000),
            )
        },
    );
    let claude_total = target * 45 / 100;
    for f in 0..claude_total.div_ceil(FILE) {
        let budget = FILE.min(claude_total - f * FILE);
        let session = format!("{}-{}", rng.hex(8), f);
        write_lines(
            &mut rng,
            &mut totals,
            claude.join(format!("{session}.jsonl")),
            budget,
            |r, i| {
                let uuid = format!("{}-{i}", r.hex(12));
                let ts =
                    format!("2026-03-04T09:{:02}:{:02}.{:03}Z", (i / 60) % 60, i % 60, i % 1000);
                match r.below(10) {
                    0 => format!(
                        r#"{{"type":"summary","summary":"{}","leafUuid":"{uuid}"}}"#,
                        r.text(80)
                    ),
                    1..=4 => format!(
                        r#"{{"type":"assistant","uuid":"{uuid}","parentUuid":null,"sessionId":"{session}","timestamp":"{ts}","cwd":"/work/app","gitBranch":"main","version":"2.1.40","message":{{"role":"assistant","model":"claude-sonnet-4-5","content":[{{"type":"text","text":"{}"}}],"usage":{{"input_tokens":{},"output_tokens":{}}}}}}}"#,
                        r.text_between(300, 3300),
                        r.below(200_000),
                        r.below(8000)
                    ),
                    _ => format!(
                        r#"{{"type":"user","uuid":"{uuid}","parentUuid":null,"sessionId":"{session}","timestamp":"{ts}","cwd":"/work/app","gitBranch":"main","version":"2.1.40","message":{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_{i}","content":"{}"}}]}}}}"#,
                        r.text_between(200, 2200)
                    ),
                }
            },
        );
    }
    let codex_total = target * 15 / 100;
    for f in 0..codex_total.div_ceil(FILE) {
        let budget = FILE.min(codex_total - f * FILE);
        let id = format!("0199{}-{f}", rng.hex(8));
        write_lines(
            &mut rng,
            &mut totals,
            codex.join(format!("rollout-2026-03-04T09-00-{f:02}-{id}.jsonl")),
            budget,
            |r, i| {
                let ts = format!("2026-03-04T09:{:02}:{:02}.000Z", (i / 60) % 60, i % 60);
                if i == 0 {
                    format!(
                        r#"{{"timestamp":"{ts}","type":"session_meta","payload":{{"id":"{id}","cwd":"/work/app","cli_version":"0.40.0"}}}}"#
                    )
                } else {
                    format!(
                        r#"{{"timestamp":"{ts}","type":"response_item","payload":{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"{}"}}]}}}}"#,
                        r.text_between(200, 1700)
                    )
                }
            },
        );
    }
    Corpus { _home: home, paths, bytes: totals.0, lines: totals.1 }
}

/// Writes lines made by `line` (given the line number) to `path` until `budget` bytes;
/// adds bytes and lines to `totals`.
fn write_lines(
    rng: &mut Rng,
    totals: &mut (u64, u64),
    path: PathBuf,
    budget: u64,
    mut line: impl FnMut(&mut Rng, u64) -> String,
) {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let (mut n, mut i) = (0u64, 0u64);
    while n < budget {
        let mut l = line(rng, i);
        l.push('\n');
        w.write_all(l.as_bytes()).unwrap();
        n += l.len() as u64;
        i += 1;
    }
    w.flush().unwrap();
    totals.0 += n;
    totals.1 += i;
}

fn opts() -> PublishOptions {
    PublishOptions {
        scope: Scope::All,
        since: None,
        dry_run: false,
        deadline: None,
        progress: false,
    }
}

/// Forgets what was published (the next run reads everything again).
fn reset(paths: &Paths) {
    let _ = std::fs::remove_file(paths.airlock_dir().join("publish/state.json"));
}

/// Keeps every gzipped batch and answers `created`.
#[derive(Default)]
struct Recorder(RefCell<Vec<Bytes>>);

impl Sink for Recorder {
    fn concurrency(&self) -> Option<usize> {
        Some(1)
    }
    async fn post(&self, gz: Bytes, items: usize) -> Result<Reply, SinkError> {
        self.0.borrow_mut().push(gz.clone());
        NullSink.post(gz, items).await
    }
}

/// A review server on a fresh embedded store, on its own runtime threads.
struct Plane {
    port: u16,
    secret: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

fn start_plane(rt: &tokio::runtime::Runtime) -> Plane {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::Sqlite(SqliteStore::open(dir.path()).unwrap());
    let (port, secret, stop) = rt.block_on(async {
        let user = store.add_user("bench@example.test", Role::Member).await.unwrap();
        let tok = token::Token::generate().unwrap();
        store.create_token("bench", &user.id, tok.hash()).await.unwrap();
        // Default limits (the advertised per-user concurrency is what both sides use), except
        // the token rate: the bench measures the store, never a 429.
        let limits = LimitsConfig {
            token_rate: Rate { per_sec: 1e9, burst: u32::MAX },
            ..LimitsConfig::default()
        };
        let state = Arc::new(AppState::with_limits(store, Engine::builtin().unwrap(), limits));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, None, state, async move {
            let _ = rx.await;
        }));
        (port, tok.expose().to_string(), tx)
    });
    Plane { port, secret, stop: Some(stop), _dir: dir }
}

impl Drop for Plane {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// `X-Airlock-Ingest-Concurrency` of the server (from `/api/v1/me`).
async fn advertised_concurrency(port: u16, secret: &str) -> usize {
    let client = airlock::remote::Client::new(
        &format!("http://127.0.0.1:{port}"),
        zeroize::Zeroizing::new(secret.to_owned()),
        None,
    )
    .unwrap();
    client.me().await.unwrap().ingest_concurrency.unwrap_or(1)
}

/// Posts `bodies` (gzipped NDJSON) over `conns` keep-alive connections, one user, as fast as
/// the server answers. Returns the elapsed time; every answer must be 200.
async fn replay(port: u16, secret: &str, bodies: Vec<Bytes>, conns: usize) -> Duration {
    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let auth = format!("Bearer {secret}");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (bodies, next, auth) = (Arc::clone(&bodies), Arc::clone(&next), auth.clone());
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                let req = http::Request::post("/api/v1/events")
                    .header("host", "127.0.0.1")
                    .header("authorization", &auth)
                    .header("content-type", "application/x-ndjson")
                    .header("content-encoding", "gzip")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let resp = send.send_request(req).await.unwrap();
                let status = resp.status();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

/// A HOME with 1,000 small files over 10 repos (log files and transcripts), all published.
fn make_many_files(rt: &tokio::runtime::Runtime) -> (tempfile::TempDir, Paths) {
    let home = tempfile::tempdir().unwrap();
    let paths = paths_for(home.path());
    let agent = paths.airlock_dir().join("agent");
    let mut n = 0;
    for r in 0..10 {
        let name = format!("repo{r}");
        let repo_path = PathBuf::from(format!("/work/{name}"));
        let logdir = airlock::audit::logdir::claim(&paths.logs_root(), &name, &repo_path).unwrap();
        let key = airlock::audit::logdir::repo_key(&name, &repo_path);
        let claude = agent.join("claude").join(&key).join(".claude/projects/-work-x");
        let codex = agent.join("codex").join(&key).join(".codex/sessions/2026/03/04");
        std::fs::create_dir_all(&claude).unwrap();
        std::fs::create_dir_all(&codex).unwrap();
        let line = |i: usize| {
            format!(
                "{{\"ts\":\"2026-03-04T09:00:00.000Z\",\"id\":\"{name}-{i}\",\"kind\":\"connect\",\"host\":\"crates.io\",\"allowed\":true}}\n"
            )
            .repeat(20)
        };
        for d in 0..30 {
            std::fs::write(logdir.join(format!("audit-2026-01-{:02}.jsonl", d + 1)), line(d))
                .unwrap();
            std::fs::write(logdir.join(format!("sessions-2026-01-{:02}.jsonl", d + 1)), line(d))
                .unwrap();
            std::fs::write(claude.join(format!("s{d}.jsonl")), line(d)).unwrap();
            n += 3;
        }
        for d in 0..10 {
            std::fs::write(codex.join(format!("rollout-2026-03-04T09-00-{d:02}-x.jsonl")), line(d))
                .unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 1000);
    let r = rt.block_on(publish::publish_async(&paths, &NullSink, &opts())).unwrap();
    assert_eq!(r.files, 1000, "{r:?}");
    (home, paths)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run_cli(home: &Path, args: &[&str]) -> (Duration, std::process::Output) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
    cmd.env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(args)
        .stdin(Stdio::null());
    let t = Instant::now();
    let out = cmd.output().unwrap();
    (t.elapsed(), out)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let env_num = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let mb = env_num("BENCH_PUBLISH_MB", if quick { 8 } else { 1024 });
    let runs = env_num("BENCH_NOCHANGE_RUNS", if quick { 3 } else { 30 }) as usize;
    // The server on two worker threads (these machines have two cores); publish runs on this
    // thread in a current-thread runtime, as the CLI does.
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    let t = Instant::now();
    let corpus = make_corpus(mb << 20);
    println!(
        "publish: corpus of {} lines, {:.1} MB (egress 40%, claude 45%, codex 15% of bytes), written in {:.1} s",
        corpus.lines,
        corpus.bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    // 1. Client side alone.
    let t = Instant::now();
    let null =
        client_rt.block_on(publish::publish_async(&corpus.paths, &NullSink, &opts())).unwrap();
    let client_side = t.elapsed();
    assert_eq!(null.bytes, corpus.bytes);
    // The same run again, keeping the batches for the replay.
    reset(&corpus.paths);
    let rec = Recorder::default();
    let recorded =
        client_rt.block_on(publish::publish_async(&corpus.paths, &rec, &opts())).unwrap();
    let bodies = rec.0.into_inner();
    let gz: usize = bodies.iter().map(Bytes::len).sum();
    println!(
        "  client side (read, frame, gzip into a null sink): {:.1} MB/s  ({} items, {} batches, {:.1} MB gzipped)",
        mb_s(null.bytes, client_side),
        null.items,
        bodies.len(),
        gz as f64 / 1e6
    );

    // 2. The store's ingest rate: the same batches replayed.
    let a = start_plane(&server_rt);
    let conns = server_rt.block_on(advertised_concurrency(a.port, &a.secret));
    let ingest = server_rt.block_on(replay(a.port, &a.secret, bodies, conns));
    drop(a);
    let ingest_rate = mb_s(recorded.bytes, ingest);
    println!(
        "  store ingest (the same batches replayed, one user, {conns} in flight): {ingest_rate:.1} MB/s  ({:.0} items/s)",
        recorded.items as f64 / ingest.as_secs_f64()
    );

    // 3. End to end through the review-plane client.
    let b = start_plane(&server_rt);
    reset(&corpus.paths);
    let client = airlock::remote::Client::new(
        &format!("http://127.0.0.1:{}", b.port),
        zeroize::Zeroizing::new(b.secret.clone()),
        None,
    )
    .unwrap();
    let t = Instant::now();
    let e2e = client_rt.block_on(publish::publish_async(&corpus.paths, &client, &opts())).unwrap();
    let e2e_time = t.elapsed();
    assert_eq!(e2e.created, e2e.items, "{e2e:?}");
    assert_eq!(e2e.bytes, corpus.bytes);
    let e2e_rate = mb_s(e2e.bytes, e2e_time);
    println!(
        "  end to end (publish to a fresh embedded store): {e2e_rate:.1} MB/s  ({} created, {} retries)",
        e2e.created, e2e.retried
    );
    println!(
        "  ratios: end to end / store ingest = {:.2}x (target >= 0.90); client side / store ingest = {:.2}x (target >= 3)",
        e2e_rate / ingest_rate,
        mb_s(null.bytes, client_side) / ingest_rate
    );
    drop(corpus);

    // 4. No-change `airlock publish --all` over 1,000 files, against process start.
    let (home, _paths) = make_many_files(&client_rt);
    let mut login = Command::new(env!("CARGO_BIN_EXE_airlock"));
    login
        .env_clear()
        .env("HOME", home.path())
        .args(["login", "--server", &format!("http://127.0.0.1:{}", b.port), "--token-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = login.spawn().unwrap();
    child.stdin.take().unwrap().write_all(format!("{}\n", b.secret).as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let (_, out) = run_cli(home.path(), &["publish", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["files"].as_u64(), v["unchanged"].as_u64()), (Some(0), Some(1000)), "{v}");
    let (mut publish_t, mut version_t) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (d, out) = run_cli(home.path(), &["publish", "--all"]);
        assert!(out.status.success());
        publish_t.push(d);
        let (d, out) = run_cli(home.path(), &["--version"]);
        assert!(out.status.success());
        version_t.push(d);
    }
    let (p, v) = (median(publish_t), median(version_t));
    println!(
        "  no-change `airlock publish --all` over 1,000 files: median {:.1} ms (target <= 50); `airlock --version` {:.1} ms; difference {:.1} ms  ({runs} interleaved pairs)",
        p.as_secs_f64() * 1e3,
        v.as_secs_f64() * 1e3,
        (p.saturating_sub(v)).as_secs_f64() * 1e3
    );
    drop(b);
}
