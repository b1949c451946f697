//! Hold-and-resume cost of an action gate (issue 18): a CONNECT to a gated target, approved by
//! an automatic approver the moment it appears, against the same CONNECT to an ungated target,
//! paired in one process against one echo upstream. Everything is on 127.0.0.0/8.
//!
//! Run: `cargo bench --bench gate` (release profile); `-- --quick` for a short smoke run.
//! Measured per attempt: connect to the proxy, `CONNECT`, read the `200`, send one byte and read
//! its echo, close. The gated path adds the gate's `requested` and `approved` audit lines, the
//! book, the approver's wake-up and its decision. Targets: ≤ 1 s more at p50, ≤ 2 s at p99.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::audit::{AuditSink, RepoLog, SessionInfo};
use airlock::gate::{GateBook, Severity};
use airlock::policy::{Entry, EntryKind, GateEntry, LayerKind, Policy, PolicyLayer};
use airlock::protocol::GateDecision;
use airlock::proxy::{Identity, Limits, SessionProxy, local_addrs, serve_session};

mod support;
use support::Fixed;

fn start_upstream(rt: &tokio::runtime::Runtime) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.2:0")).unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 || s.write_all(&b[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One session allowing `bench.test:<port>`, gated when `book` is given.
fn start_session(
    rt: &tokio::runtime::Runtime,
    log: &Arc<RepoLog>,
    upstream: SocketAddr,
    book: Option<Arc<GateBook>>,
) -> SocketAddr {
    let entry = format!("bench.test:{}", upstream.port());
    let mut layer = PolicyLayer::new(LayerKind::Operator, "bench.toml");
    layer.allow = vec![Entry::parse(&entry, EntryKind::Allow).unwrap()];
    layer.allow_private = vec!["127.0.0.2/32".parse().unwrap()];
    if book.is_some() {
        layer.gates = vec![GateEntry {
            entry: Entry::parse(&entry, EntryKind::Allow).unwrap(),
            severity: Severity::Medium,
        }];
    }
    let policy = Arc::new(Policy::build(vec![layer], Vec::new()).unwrap().0);
    let name = if book.is_some() { "gated" } else { "plain" };
    let sink: Arc<dyn AuditSink> = Arc::new(log.session_sink(SessionInfo {
        session: format!("bench-{name}"),
        repo: "bench".into(),
        repo_path: None,
        repo_key: None,
        user_id: Some("bench".into()),
    }));
    let mut session = SessionProxy::new(
        policy,
        sink,
        Arc::new(Fixed("127.0.0.2".parse().unwrap())),
        Limits { max_tunnels: 100_000, ..Limits::default() },
        local_addrs(),
        Identity { repo: "bench".into(), repo_path: None, repo_key: None, user_id: None },
    );
    if let Some(book) = book {
        session = session.with_gates(book);
    }
    let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(tx); // the session lives for the whole run
    rt.spawn(serve_session(l, Arc::new(session), rx));
    addr
}

/// Approves every gate as soon as the book shows it, as `airlock gate watch` would with a
/// person who always says yes.
fn start_approver(rt: &tokio::runtime::Runtime, book: Arc<GateBook>) {
    rt.spawn(async move {
        let mut version = 0;
        loop {
            let (v, gates) = book.wait_change(version, Duration::from_secs(60)).await;
            version = v;
            for g in gates {
                let d = GateDecision {
                    id: g.id,
                    digest: g.digest,
                    approve: true,
                    note: String::new(),
                    by: "bench@example.test".into(),
                    relay: None,
                };
                let _ = book.decide(&d, "2026-12-04T00:00:00.000Z".into());
            }
        }
    });
}

/// One attempt through `proxy` to `target`; its latency.
fn attempt(proxy: SocketAddr, target: &str) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[..12], b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    s.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    started.elapsed()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 50 } else { 500 };
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let log = RepoLog::open(tmp.path().join("logs"), "bench-boot").unwrap();
    let upstream = start_upstream(&rt);
    let book = GateBook::new(16);
    start_approver(&rt, Arc::clone(&book));
    let plain = start_session(&rt, &log, upstream, None);
    let gated = start_session(&rt, &log, upstream, Some(book));
    let target = format!("bench.test:{}", upstream.port());
    for _ in 0..20 {
        attempt(plain, &target);
        attempt(gated, &target);
    }
    // Paired and alternating, so drift on a noisy machine hits both alike.
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            a.push(attempt(plain, &target));
            b.push(attempt(gated, &target));
        } else {
            b.push(attempt(gated, &target));
            a.push(attempt(plain, &target));
        }
    }
    a.sort();
    b.sort();
    let (a50, a99, b50, b99) = (pct(&a, 0.5), pct(&a, 0.99), pct(&b, 0.5), pct(&b, 0.99));
    println!("gate hold-and-resume, {n} paired CONNECTs (connect, 200, 1-byte echo, close):");
    println!("  ungated  p50 {:8.3} ms  p99 {:8.3} ms", ms(a50), ms(a99));
    println!("  gated    p50 {:8.3} ms  p99 {:8.3} ms", ms(b50), ms(b99));
    println!(
        "  added    p50 {:8.3} ms  p99 {:8.3} ms   (targets: ≤ 1000 ms, ≤ 2000 ms)",
        ms(b50.saturating_sub(a50)),
        ms(b99.saturating_sub(a99))
    );
    println!(
        "  ratio    p50 {:.2}×  p99 {:.2}×",
        b50.as_secs_f64() / a50.as_secs_f64(),
        b99.as_secs_f64() / a99.as_secs_f64()
    );
}
