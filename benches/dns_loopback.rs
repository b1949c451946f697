//! Loopback harness for the sandbox's resolver (issue 14: DNS answer p50 ≤ 200 µs). A client
//! thread sends one `A` query at a time over UDP to `proxy::dns::serve` (a real session proxy
//! with a file audit sink, so every answer includes its audit line) and waits for the answer.
//! Baseline in the same run: the same client against a raw UDP echo server on the same tokio
//! runtime (what any UDP request/response costs on this machine).
//!
//! Run: `cargo bench --bench dns_loopback` (release profile); `-- --quick` for a smoke run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::audit::{AuditSink, RepoLog, SessionInfo};
use airlock::policy::{Entry, EntryKind, LayerKind, Policy, PolicyLayer};
use airlock::proxy::{Identity, Limits, SessionProxy, SystemResolver, local_addrs};

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for l in name.split('.') {
        m.push(l.len() as u8);
        m.extend_from_slice(l.as_bytes());
    }
    m.extend_from_slice(&[0, 0, 1, 0, 1]);
    m
}

fn measure(server: SocketAddr, n: usize, check: impl Fn(&[u8])) -> Vec<Duration> {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    c.connect(server).unwrap();
    let mut buf = [0u8; 1024];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // A handful of names: the table lookup path after the first answer of each.
        let q = query(i as u16, &format!("n{}.bench.test", i % 16));
        let t = Instant::now();
        c.send(&q).unwrap();
        let got = c.recv(&mut buf).unwrap();
        out.push(t.elapsed());
        check(&buf[..got]);
    }
    out.sort();
    out
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 2_000 } else { 20_000 };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let log = RepoLog::open(tmp.path().join("logs"), "bench-boot").unwrap();
    let mut layer = PolicyLayer::new(LayerKind::Operator, "bench.toml");
    layer.allow = vec![Entry::parse("*.bench.test", EntryKind::Allow).unwrap()];
    let policy = Arc::new(Policy::build(vec![layer], Vec::new()).unwrap().0);
    let sink: Arc<dyn AuditSink> = Arc::new(log.session_sink(SessionInfo {
        session: "bench-dns".into(),
        repo: "bench".into(),
        repo_path: None,
        repo_key: None,
        user_id: Some("bench".into()),
    }));
    let session = Arc::new(SessionProxy::new(
        policy,
        sink,
        // Never asked: the resolver answers from the synthetic table only.
        Arc::new(SystemResolver),
        Limits::default(),
        local_addrs(),
        Identity {
            repo: "bench".into(),
            repo_path: None,
            repo_key: None,
            user_id: Some("bench".into()),
        },
    ));
    let dns = rt.block_on(tokio::net::UdpSocket::bind("127.0.0.1:0")).unwrap();
    let dns_addr = dns.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    rt.spawn(airlock::proxy::dns::serve(Some(dns), None, session, rx));
    let echo = rt.block_on(tokio::net::UdpSocket::bind("127.0.0.1:0")).unwrap();
    let echo_addr = echo.local_addr().unwrap();
    rt.spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok((n, peer)) = echo.recv_from(&mut buf).await {
            let _ = echo.send_to(&buf[..n], peer).await;
        }
    });
    // Warm-up, then alternate rounds so load changes hit both alike.
    let _ = measure(dns_addr, 500, |_| {});
    let _ = measure(echo_addr, 500, |_| {});
    let rounds = 4;
    let (mut d_all, mut e_all) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        e_all.extend(measure(echo_addr, n / rounds, |_| {}));
        d_all.extend(measure(dns_addr, n / rounds, |r| {
            assert_eq!(r[3] & 0xf, 0, "NOERROR");
            assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        }));
    }
    d_all.sort();
    e_all.sort();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("dns_loopback: {} queries each, load {}", d_all.len(), load.trim());
    for (name, v) in [("raw UDP echo", &e_all), ("DNS answer (+ audit line)", &d_all)] {
        println!(
            "  {name:<28} p50 {:>7.1} µs  p90 {:>7.1} µs  p99 {:>7.1} µs",
            us(pct(v, 0.5)),
            us(pct(v, 0.9)),
            us(pct(v, 0.99))
        );
    }
    println!(
        "  DNS p50 / echo p50 = {:.2}x; DNS p50 - echo p50 = {:.1} µs (target: DNS p50 ≤ 200 µs)",
        us(pct(&d_all, 0.5)) / us(pct(&e_all, 0.5)),
        us(pct(&d_all, 0.5)) - us(pct(&e_all, 0.5))
    );
    let _ = tx.send(true);
}
