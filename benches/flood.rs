//! Loopback harness for a refusal flood (issue 14): does one session's flood slow another
//! session, and does the rate-limited audit log lose any count? Everything stays on
//! 127.0.0.0/8; names resolve through a fixed in-process resolver to 127.0.0.2, and the flooded
//! name is refused by policy before any resolution.
//!
//! Two sessions as the daemon runs them (one [`SessionProxy`] and listener each, served on one
//! shared multi-thread runtime like `airlockd`'s, each with its own repo log): **B** makes
//! sequential `CONNECT` → `200` attempts to an allowed loopback upstream, **A** is flooded with
//! refused `CONNECT`s by several client threads, a new connection each (a refusal answers
//! `Connection: close`, so there is no keep-alive to reuse), as fast as they go.
//!
//! 1. B alone: CONNECT→200 latency (request written to `200` read, TCP connect excluded).
//! 2. A flooded with the default `[audit] burst` while B repeats the measurement (1 and 2
//!    alternate in `--rounds` rounds, so outside load hits both alike); then A's
//!    session ends (drain and flush, as at a session's stop) and its audit log is read back:
//!    individual refusal lines + the `count` of every `suppressed` line must equal the attempts
//!    A's clients saw answered, exactly, and every `seq` from 1 must be held exactly once.
//! 3. The same flood against a session **C** with the rate limit off (`burst = 0`, no budget),
//!    B measuring again: the unbounded audit rate the issue reported (~29 MB/s) in the same run.
//!
//! Run: `cargo bench --bench flood` (release profile). Options: `-- --quick` (short run),
//! `--clients N` (flood threads, default 4), `--samples N` (B's attempts per phase, default
//! 5000), `--rounds N` (default 5), `--unbounded-secs S` (phase 3's length, default 3; 0 skips
//! it), `--http-path N` (flood with plain-HTTP `GET`s of an N-byte path instead of `CONNECT`s:
//! longer lines, as in the report). A count mismatch is
//! printed as `MISMATCH` and the process exits 1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use airlock::audit::{AuditSink, FileAuditSink, RepoLog, SessionInfo, volume::Volume};
use airlock::policy::{Entry, EntryKind, LayerKind, Policy, PolicyLayer};
use airlock::proxy::{Identity, Limits, SessionProxy, local_addrs, serve_session};

mod support;
use support::Fixed;

const UPSTREAM_IP: &str = "127.0.0.2";
/// The name A's clients ask for: not on the allowlist, so refused `not_allowed`.
const DENIED: &str = "denied.test";

/// One running session: its listener's address, its log directory and its stop switch.
struct Session {
    addr: SocketAddr,
    dir: std::path::PathBuf,
    stop: tokio::sync::watch::Sender<bool>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn start_session(
    rt: &tokio::runtime::Runtime,
    root: &Path,
    name: &str,
    upstream: SocketAddr,
    volume: Volume,
) -> Session {
    let mut layer = PolicyLayer::new(LayerKind::Operator, "bench.toml");
    layer.allow =
        vec![Entry::parse(&format!("bench.test:{}", upstream.port()), EntryKind::Allow).unwrap()];
    layer.allow_private = vec![format!("{UPSTREAM_IP}/32").parse().unwrap()];
    let policy = Arc::new(Policy::build(vec![layer], Vec::new()).unwrap().0);
    let dir = root.join(name);
    let log = RepoLog::open(&dir, "bench-boot").unwrap();
    let info = SessionInfo {
        session: format!("bench-{name}"),
        repo: name.into(),
        repo_path: None,
        repo_key: None,
        user_id: Some("bench".into()),
    };
    let sink: Arc<dyn AuditSink> = Arc::new(FileAuditSink::with_volume(log, info, volume));
    let session = Arc::new(SessionProxy::new(
        policy,
        sink,
        Arc::new(Fixed(UPSTREAM_IP.parse().unwrap())),
        Limits::default(),
        local_addrs(),
        Identity {
            repo: name.into(),
            repo_path: None,
            repo_key: None,
            user_id: Some("bench".into()),
        },
    ));
    let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let served = rt.spawn(serve_session(l, session, rx));
    Session { addr, dir, stop, served }
}

/// Ends a session as the daemon does at a session's stop: drain, then every pending
/// `suppressed` summary is written.
fn end_session(rt: &tokio::runtime::Runtime, s: Session) -> std::path::PathBuf {
    let _ = s.stop.send(true);
    rt.block_on(s.served).unwrap().unwrap();
    s.dir
}

/// An upstream that holds each connection open until the client closes it.
fn start_upstream(rt: &tokio::runtime::Runtime) -> SocketAddr {
    use tokio::io::AsyncReadExt;
    let l = rt.block_on(tokio::net::TcpListener::bind((UPSTREAM_IP, 0))).unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads up to the end of the response head; `None` if the connection ended first.
fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 512];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(&head[..i + 4]).into_owned());
        }
    }
}

/// B's measurement: `n` sequential CONNECT→200 latencies, sorted.
fn connect_200(proxy: SocketAddr, upstream: SocketAddr, n: usize) -> Vec<Duration> {
    let req = format!("CONNECT bench.test:{} HTTP/1.1\r\n\r\n", upstream.port());
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(proxy).unwrap();
        s.set_nodelay(true).unwrap();
        let t = Instant::now();
        s.write_all(req.as_bytes()).unwrap();
        let head = read_head(&mut s).expect("B's tunnel closed before its 200");
        lat.push(t.elapsed());
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    lat.sort();
    lat
}

/// A flood in progress: client threads making refused attempts until stopped.
struct Flood {
    stop: Arc<AtomicBool>,
    /// Attempts answered with a response head (each has exactly one audit line or count).
    answered: Arc<AtomicU64>,
    /// Connections accepted but closed without a response head (should stay 0).
    unanswered: Arc<AtomicU64>,
    /// Connects that failed (no attempt reached the proxy; e.g. out of ephemeral ports).
    connect_failed: Arc<AtomicU64>,
    /// Answers other than `403 … not_allowed` (e.g. `503 connection_limit`); still one line.
    other: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    started: Instant,
}

struct Flooded {
    answered: u64,
    unanswered: u64,
    connect_failed: u64,
    other: u64,
    secs: f64,
}

fn start_flood(proxy: SocketAddr, clients: usize, req: &str) -> Flood {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let unanswered = Arc::new(AtomicU64::new(0));
    let connect_failed = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let threads = (0..clients)
        .map(|_| {
            let (stop, answered, unanswered, connect_failed, other) = (
                Arc::clone(&stop),
                Arc::clone(&answered),
                Arc::clone(&unanswered),
                Arc::clone(&connect_failed),
                Arc::clone(&other),
            );
            let req = req.to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(proxy) else {
                        connect_failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    match s.write_all(req.as_bytes()).ok().and_then(|()| read_head(&mut s)) {
                        Some(head) => {
                            answered.fetch_add(1, Ordering::Relaxed);
                            if !head.contains("X-Airlock-Reason: not_allowed") {
                                other.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => {
                            unanswered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    Flood { stop, answered, unanswered, connect_failed, other, threads, started: Instant::now() }
}

impl Flooded {
    fn add(&mut self, o: Flooded) {
        self.answered += o.answered;
        self.unanswered += o.unanswered;
        self.connect_failed += o.connect_failed;
        self.other += o.other;
        self.secs += o.secs;
    }
}

impl Flood {
    fn stop(self) -> Flooded {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Flooded {
            answered: self.answered.load(Ordering::Relaxed),
            unanswered: self.unanswered.load(Ordering::Relaxed),
            connect_failed: self.connect_failed.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
            secs: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// What a session's audit log holds, read back after the session ended.
#[derive(Debug, Default)]
struct Tally {
    bytes: u64,
    /// Individual attempt lines.
    singles: u64,
    /// `suppressed` lines and the sum of their `count`.
    summaries: u64,
    suppressed: u64,
    /// A summary whose `count` is not the size of its `seqs` ranges.
    bad_counts: u64,
    /// `seq` values held more than once, and missing from 1..=max.
    dup_seqs: u64,
    missing_seqs: u64,
}

fn tally(dir: &Path) -> Tally {
    let mut t = Tally::default();
    let mut held: Vec<u8> = Vec::new();
    let mark = |held: &mut Vec<u8>, q: u64| {
        let q = q as usize;
        if held.len() <= q {
            held.resize(q + 1, 0);
        }
        held[q] = held[q].saturating_add(1);
    };
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("audit-") && name.ends_with(".jsonl")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        t.bytes += text.len() as u64;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(ranges) = v.get("seqs").and_then(|r| r.as_array()) {
                let mut n = 0;
                for r in ranges {
                    let (a, b) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
                    (a..=b).for_each(|q| mark(&mut held, q));
                    n += b - a + 1;
                }
                if v["count"].as_u64() != Some(n) {
                    t.bad_counts += 1;
                }
                t.summaries += 1;
                t.suppressed += v["count"].as_u64().unwrap_or(0);
            } else if let Some(q) = v.get("seq").and_then(|s| s.as_u64()) {
                mark(&mut held, q);
                t.singles += 1;
            }
        }
    }
    for &n in held.iter().skip(1) {
        match n {
            0 => t.missing_seqs += 1,
            1 => {}
            _ => t.dup_seqs += 1,
        }
    }
    t
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn load() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Prints the flood's numbers and the log check; `false` on any count mismatch.
fn report(label: &str, f: &Flooded, t: &Tally) -> bool {
    println!(
        "  {label}: {} attempts answered in {:.2} s = {:.0} refusals/s offered ({} unanswered, {} \
         connect failures, {} not `not_allowed`)",
        f.answered,
        f.secs,
        f.answered as f64 / f.secs,
        f.unanswered,
        f.connect_failed,
        f.other
    );
    println!(
        "  {label}: audit log {} bytes = {:.2} MB/s; {} lines + {} suppressed (in {} summaries) \
         = {} vs {} attempts",
        t.bytes,
        t.bytes as f64 / f.secs / 1e6,
        t.singles,
        t.suppressed,
        t.summaries,
        t.singles + t.suppressed,
        f.answered
    );
    let exact = t.singles + t.suppressed == f.answered
        && f.unanswered == 0
        && t.bad_counts == 0
        && t.dup_seqs == 0
        && t.missing_seqs == 0;
    if exact {
        println!("  {label}: count exact (every seq 1..={} held once)", f.answered);
    } else {
        println!(
            "  {label}: MISMATCH: lines + suppressed = {} but {} attempts answered, {} unanswered; \
             {} summaries with a wrong count, {} seqs held twice, {} missing",
            t.singles + t.suppressed,
            f.answered,
            f.unanswered,
            t.bad_counts,
            t.dup_seqs,
            t.missing_seqs
        );
    }
    exact
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().unwrap())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let clients = arg(&args, "--clients", 4);
    let samples = arg(&args, "--samples", if quick { 1_000 } else { 5_000 });
    let unbounded_secs = arg(&args, "--unbounded-secs", if quick { 1 } else { 3 });
    let rounds = arg(&args, "--rounds", if quick { 2 } else { 5 }).max(1);
    // CONNECT refusals by default; `--http-path N`: plain-HTTP GETs with an N-byte path (the
    // URL lands in the line: the issue's ~2.7 KB lines at 29 MB/s).
    let http_path = arg(&args, "--http-path", 0);
    let request = if http_path == 0 {
        format!("CONNECT {DENIED}:443 HTTP/1.1\r\nHost: {DENIED}:443\r\n\r\n")
    } else {
        let path = "p".repeat(http_path);
        format!("GET http://{DENIED}/{path} HTTP/1.1\r\nHost: {DENIED}\r\n\r\n")
    };
    let tmp = tempfile::tempdir().unwrap();
    // Like `airlockd`: one multi-thread runtime (a worker per core) for every session.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let upstream = start_upstream(&rt);
    let b = start_session(&rt, tmp.path(), "b", upstream, Volume::default());
    let a = start_session(&rt, tmp.path(), "a", upstream, Volume::default());
    println!(
        "# flood benchmark ({} cores, load {}): {clients} flood clients, {} refusals, {samples} \
         B samples per phase in {rounds} interleaved rounds",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load(),
        if http_path == 0 { "CONNECT".to_owned() } else { format!("GET /<{http_path} bytes>") }
    );

    // 1 and 2, interleaved in rounds so that load from outside hits both alike: B alone, then
    // A flooded (default burst) while B measures again. A's attempts add up over the rounds.
    let _ = connect_200(b.addr, upstream, samples / 10); // warm-up
    let (mut alone, mut flooded) = (Vec::new(), Vec::new());
    let mut fa = Flooded { answered: 0, unanswered: 0, connect_failed: 0, other: 0, secs: 0.0 };
    for _ in 0..rounds {
        alone.extend(connect_200(b.addr, upstream, samples / rounds));
        let flood = start_flood(a.addr, clients, &request);
        std::thread::sleep(Duration::from_millis(300)); // the flood reaches its pace
        flooded.extend(connect_200(b.addr, upstream, samples / rounds));
        fa.add(flood.stop());
    }
    alone.sort();
    flooded.sort();
    let ta = tally(&end_session(&rt, a));

    let ratio = us(pct(&flooded, 0.5)) / us(pct(&alone, 0.5));
    println!(
        "  B connect->200 alone:        p50 {:>7.1} us  p99 {:>8.1} us",
        us(pct(&alone, 0.5)),
        us(pct(&alone, 0.99))
    );
    println!(
        "  B connect->200 while A floods: p50 {:>7.1} us  p99 {:>8.1} us  (p50 ratio {ratio:.2}x; \
         target <= 2x)",
        us(pct(&flooded, 0.5)),
        us(pct(&flooded, 0.99))
    );
    let mut exact = report("A (burst 20)", &fa, &ta);

    // 3. The same flood with the rate limit off: the unbounded baseline.
    if unbounded_secs > 0 {
        let unlimited = Volume { burst: 0, session_budget: u64::MAX, ..Volume::default() };
        let c = start_session(&rt, tmp.path(), "c", upstream, unlimited);
        let flood = start_flood(c.addr, clients, &request);
        std::thread::sleep(Duration::from_millis(300));
        let deadline = Instant::now() + Duration::from_secs(unbounded_secs as u64);
        let mut during = Vec::new();
        while Instant::now() < deadline {
            during.extend(connect_200(b.addr, upstream, 100));
        }
        let fc = flood.stop();
        let tc = tally(&end_session(&rt, c));
        during.sort();
        println!(
            "  B connect->200 while C floods unbounded: p50 {:>7.1} us  p99 {:>8.1} us  (p50 \
             ratio {:.2}x)",
            us(pct(&during, 0.5)),
            us(pct(&during, 0.99)),
            us(pct(&during, 0.5)) / us(pct(&alone, 0.5))
        );
        exact &= report("C (burst 0, unbounded)", &fc, &tc);
        println!(
            "flood: B p50 ratio {ratio:.2}x (target <= 2x); A offered {:.0}/s, audit {:.3} MB/s \
             vs unbounded {:.1} MB/s at {:.0}/s; counts {}; load {}",
            fa.answered as f64 / fa.secs,
            ta.bytes as f64 / fa.secs / 1e6,
            tc.bytes as f64 / fc.secs / 1e6,
            fc.answered as f64 / fc.secs,
            if exact { "exact" } else { "MISMATCH" },
            load()
        );
    } else {
        println!(
            "flood: B p50 ratio {ratio:.2}x (target <= 2x); A offered {:.0}/s, audit {:.3} MB/s; \
             counts {}; load {}",
            fa.answered as f64 / fa.secs,
            ta.bytes as f64 / fa.secs / 1e6,
            if exact { "exact" } else { "MISMATCH" },
            load()
        );
    }
    let _ = end_session(&rt, b);
    if !exact {
        std::process::exit(1);
    }
}
