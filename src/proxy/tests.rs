//! Engine tests against an in-memory audit sink: ordering (line before response), fail-closed
//! journal, tunnel cap, address guard on resolver answers, byte counts. Loopback only; names
//! resolve only through the test resolver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::resolver::FileResolver;
use super::*;
use crate::audit::{AuditError, AuditLine, AuditSink, Stamp};
use crate::policy::{Entry, EntryKind, LayerKind, Policy, PolicyLayer, Reason};

#[derive(Default)]
struct MemSink {
    /// ("append" | "open" | "close", line)
    log: Mutex<Vec<(&'static str, AuditLine)>>,
    seq: AtomicU64,
    fail_journal: bool,
}

impl MemSink {
    fn lines(&self) -> Vec<(&'static str, AuditLine)> {
        self.log.lock().unwrap().clone()
    }
}

impl AuditSink for MemSink {
    fn stamp(&self) -> Stamp {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        Stamp { id: format!("t-{seq}"), session: "s".into(), boot: "b".into(), seq }
    }
    fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.log.lock().unwrap().push(("append", line.clone()));
        Ok(())
    }
    fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError> {
        if self.fail_journal {
            return Err(AuditError::Write {
                path: "/nonexistent/journal".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            });
        }
        self.log.lock().unwrap().push(("open", line.clone()));
        Ok(())
    }
    fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.log.lock().unwrap().push(("close", line.clone()));
        Ok(())
    }
}

/// An echo upstream on `ip`, counting connections.
async fn echo_upstream(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, hits)
}

struct Rig {
    addr: SocketAddr,
    sink: Arc<MemSink>,
    session: Arc<SessionProxy>,
    _stop: watch::Sender<bool>,
}

async fn rig(
    allow: &[&str],
    private: &[&str],
    resolver: &str,
    sink: MemSink,
    limits: Limits,
) -> Rig {
    let mut layer = PolicyLayer::new(LayerKind::Operator, "test.toml");
    layer.allow = allow.iter().map(|a| Entry::parse(a, EntryKind::Allow).unwrap()).collect();
    layer.allow_private = private.iter().map(|p| p.parse().unwrap()).collect();
    let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
    let sink = Arc::new(sink);
    let session = Arc::new(SessionProxy::new(
        Arc::new(policy),
        Arc::clone(&sink) as Arc<dyn AuditSink>,
        Arc::new(FileResolver::from_text(resolver).unwrap()),
        limits,
        local_addrs(),
        Identity { repo: "r".into(), repo_path: None, repo_key: None, user_id: Some("u1".into()) },
    ));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(serve_session(l, Arc::clone(&session), rx));
    Rig { addr, sink, session, _stop: tx }
}

/// Sends `req` and reads the response head (up to the blank line).
async fn ask(addr: SocketAddr, req: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test]
async fn denied_connect_is_audited_before_the_403() {
    let r = rig(&["example.test"], &[], "", MemSink::default(), Limits::default()).await;
    let (_s, head) = ask(r.addr, "CONNECT pastebin.com:443 HTTP/1.1\r\n\r\n").await;
    // The line is in the sink by the time the client has the response.
    let lines = r.sink.lines();
    assert!(head.starts_with("HTTP/1.1 403 Forbidden by airlock policy\r\n"), "{head}");
    assert!(head.contains("X-Airlock-Reason: not_allowed\r\n"), "{head}");
    assert!(head.contains("X-Airlock-Layer: none\r\n"), "{head}");
    assert!(head.contains("Connection: close\r\n"), "{head}");
    assert_eq!(lines.len(), 1);
    let (kind, line) = &lines[0];
    assert_eq!(*kind, "append");
    assert_eq!(line.host, "pastebin.com");
    assert_eq!(line.reason, Some(Reason::NotAllowed));
    assert_eq!(line.user_id.as_deref(), Some("u1"));
    assert!(!line.allowed);
    // docs/audit-format.md: `duration_ms` is present on every denied line.
    assert!(line.duration_ms.is_some(), "{line:?}");
}

#[tokio::test]
async fn a_plain_http_target_hyper_cannot_parse_is_audited_as_malformed() {
    let r = rig(&["example.test"], &[], "", MemSink::default(), Limits::default()).await;
    let (_s, head) = ask(r.addr, "GET http://a%2ecom/ HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let lines = r.sink.lines();
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: malformed\r\n"), "{head}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let (kind, line) = &lines[0];
    assert_eq!(*kind, "append");
    assert_eq!(line.reason, Some(Reason::Malformed));
    assert_eq!(line.method, "GET");
    assert!(!line.allowed);
}

#[tokio::test]
async fn allowed_tunnel_counts_bytes_and_records_addr() {
    let (up, hits) = echo_upstream("127.0.0.2").await;
    let entry = format!("example.test:{}", up.port());
    let r = rig(
        &[&entry],
        &["127.0.0.2/32"],
        "example.test 127.0.0.2",
        MemSink::default(),
        Limits::default(),
    )
    .await;
    let (mut s, head) =
        ask(r.addr, &format!("CONNECT example.test:{} HTTP/1.1\r\n\r\n", up.port())).await;
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    s.write_all(b"ping-pong").await.unwrap();
    let mut back = [0u8; 9];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping-pong");
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    for _ in 0..100 {
        if r.sink.lines().iter().any(|(k, _)| *k == "close") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = r.sink.lines();
    assert_eq!(lines.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["open", "close"]);
    let close = &lines[1].1;
    assert!(close.allowed);
    assert_eq!(close.bytes_sent, Some(9));
    assert_eq!(close.bytes_recv, Some(9));
    assert_eq!(close.addr.as_deref(), Some(up.to_string().as_str()));
    // Allowed lines name the allowing entry (docs/audit-format.md), journal record included.
    for (_, l) in &lines {
        assert_eq!(l.reason, Some(Reason::Allowed));
        assert_eq!(l.layer, Some(LayerKind::Operator));
        assert_eq!(l.policy.as_deref(), Some("test.toml"));
        assert_eq!(l.rule.as_deref(), Some(entry.as_str()));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(r.session.stats().bytes_sent, 9);
}

#[tokio::test]
async fn private_answer_refuses_and_never_dials() {
    // The sentinel on 127.0.0.3 must never see a connection: 127.0.0.3 is not in allow_private.
    let (sentinel, hits) = echo_upstream("127.0.0.3").await;
    let entry = format!("mixed.test:{}", sentinel.port());
    let r = rig(
        &[&entry],
        &["127.0.0.2/32"],
        "mixed.test 127.0.0.2 127.0.0.3",
        MemSink::default(),
        Limits::default(),
    )
    .await;
    let (_s, head) =
        ask(r.addr, &format!("CONNECT mixed.test:{} HTTP/1.1\r\n\r\n", sentinel.port())).await;
    assert!(head.contains("X-Airlock-Reason: private_address"), "{head}");
    let lines = r.sink.lines();
    assert_eq!(lines.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["open", "close"]);
    assert!(!lines[1].1.allowed);
    // Only the refused answer is listed, and the allowing entry no longer decides.
    assert_eq!(lines[1].1.refused_addrs.as_deref(), Some(&["127.0.0.3".to_owned()][..]));
    assert_eq!(lines[1].1.reason, Some(Reason::PrivateAddress));
    assert_eq!(lines[1].1.rule, None);
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn refused_addrs_lists_at_most_eight_answers() {
    let answers: Vec<String> = (10..30).map(|n| format!("127.0.1.{n}")).collect();
    let r = rig(
        &["many.test:9"],
        &[],
        &format!("many.test {}", answers.join(" ")),
        MemSink::default(),
        Limits::default(),
    )
    .await;
    let (_s, head) = ask(r.addr, "CONNECT many.test:9 HTTP/1.1\r\n\r\n").await;
    assert!(head.contains("X-Airlock-Reason: private_address"), "{head}");
    let lines = r.sink.lines();
    let refused = lines[1].1.refused_addrs.clone().unwrap();
    assert_eq!(refused, answers[..crate::audit::MAX_REFUSED_ADDRS].to_vec());
}

#[tokio::test]
async fn journal_failure_is_503_and_nothing_forwarded() {
    let (up, hits) = echo_upstream("127.0.0.2").await;
    let entry = format!("example.test:{}", up.port());
    let sink = MemSink { fail_journal: true, ..MemSink::default() };
    let r =
        rig(&[&entry], &["127.0.0.2/32"], "example.test 127.0.0.2", sink, Limits::default()).await;
    let (_s, head) =
        ask(r.addr, &format!("CONNECT example.test:{} HTTP/1.1\r\n\r\n", up.port())).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: audit_unavailable"), "{head}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn tunnel_cap_is_503_and_audited() {
    let (up, _hits) = echo_upstream("127.0.0.2").await;
    let entry = format!("example.test:{}", up.port());
    let limits = Limits { max_tunnels: 1, ..Limits::default() };
    let r = rig(&[&entry], &["127.0.0.2/32"], "example.test 127.0.0.2", MemSink::default(), limits)
        .await;
    let req = format!("CONNECT example.test:{} HTTP/1.1\r\n\r\n", up.port());
    let (_first, head) = ask(r.addr, &req).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_second, head) = ask(r.addr, &req).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: tunnel_limit"), "{head}");
    let capped: Vec<_> =
        r.sink.lines().into_iter().filter(|(_, l)| l.reason == Some(Reason::TunnelLimit)).collect();
    assert_eq!(capped.len(), 1);
    assert_eq!(capped[0].0, "append");
    assert!(capped[0].1.duration_ms.is_some(), "{:?}", capped[0].1);
}

#[tokio::test]
async fn slow_drip_and_flood_are_cut_off() {
    let limits = Limits {
        header_timeout: Duration::from_millis(200),
        max_header_bytes: 1024,
        ..Limits::default()
    };
    let r = rig(&["example.test"], &[], "", MemSink::default(), limits).await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"CONNECT exam").await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    assert!(String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 408 "));
    let flood = format!("CONNECT example.test:443 HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(4096));
    let (_s, head) = ask(r.addr, &flood).await;
    assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
    let reasons: Vec<_> = r.sink.lines().iter().map(|(_, l)| l.reason).collect();
    assert_eq!(reasons, [Some(Reason::Malformed), Some(Reason::Malformed)]);
}

#[tokio::test]
async fn drain_closes_open_tunnels_as_interrupted() {
    let (up, _hits) = echo_upstream("127.0.0.2").await;
    let entry = format!("example.test:{}", up.port());
    let limits = Limits { drain_grace: Duration::from_millis(50), ..Limits::default() };
    let mut layer = PolicyLayer::new(LayerKind::Operator, "t");
    layer.allow = vec![Entry::parse(&entry, EntryKind::Allow).unwrap()];
    layer.allow_private = vec!["127.0.0.2/32".parse().unwrap()];
    let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
    let sink = Arc::new(MemSink::default());
    let session = Arc::new(SessionProxy::new(
        Arc::new(policy),
        Arc::clone(&sink) as Arc<dyn AuditSink>,
        Arc::new(FileResolver::from_text("example.test 127.0.0.2").unwrap()),
        limits,
        local_addrs(),
        Identity::default(),
    ));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    let served = tokio::spawn(serve_session(l, Arc::clone(&session), rx));
    let (_s, head) =
        ask(addr, &format!("CONNECT example.test:{} HTTP/1.1\r\n\r\n", up.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"));
    assert_eq!(session.stats().active_tunnels, 1);
    tx.send(true).unwrap();
    served.await.unwrap().unwrap();
    let lines = sink.lines();
    let close = lines.iter().find(|(k, _)| *k == "close").expect("final line");
    assert_eq!(close.1.interrupted, Some(true));
    assert_eq!(session.stats().active_tunnels, 0);
    assert!(TcpStream::connect(addr).await.is_err(), "listener must be closed");
}

mod dns_and_synthetic {
    use super::*;
    use crate::proxy::dns::tests::{query, read_response};
    use crate::proxy::dns::{self, answer_message};
    use std::net::Ipv4Addr;

    fn dns_lines(sink: &MemSink) -> Vec<AuditLine> {
        sink.lines().into_iter().filter(|(_, l)| l.method == "DNS").map(|(_, l)| l).collect()
    }

    #[tokio::test]
    async fn allowed_names_get_a_stable_synthetic_a_and_nodata_for_other_types() {
        let r =
            rig(&["allowed.test", "git.test:22"], &[], "", MemSink::default(), Limits::default())
                .await;
        let ask = |name: &str, qtype: u16| {
            let resp = answer_message(&r.session, &query(7, name, qtype, None), None).unwrap();
            read_response(&resp)
        };
        let (rcode, tc, an, a) = ask("allowed.test", 1);
        assert_eq!((rcode, tc, an), (0, false, 1));
        let a = a.unwrap();
        assert!(crate::proxy::synthetic::in_range(a.into()), "{a}");
        assert_eq!(ask("ALLOWED.test", 1).3, Some(a), "stable, case-insensitive");
        // Allowed on port 22 only still counts: "allowed on any port".
        assert_eq!(ask("git.test", 1).0, 0);
        for qtype in [28, 65, 64, 16, 255] {
            assert_eq!(ask("allowed.test", qtype), (0, false, 0, None), "qtype {qtype}: NODATA");
        }
        assert_eq!(ask("refused.test", 1), (3, false, 0, None), "NXDOMAIN");
        assert_eq!(ask("refused.test", 28).0, 3);
        let lines = dns_lines(&r.sink);
        assert_eq!(lines.len(), 10, "one line per query");
        let first = &lines[0];
        assert_eq!(
            (first.host.as_str(), first.qtype.as_deref(), first.allowed, first.reason),
            ("allowed.test", Some("A"), true, Some(Reason::Allowed))
        );
        assert_eq!(first.answer.as_deref(), Some(a.to_string().as_str()));
        let refused = lines.iter().find(|l| l.host == "refused.test").unwrap();
        assert_eq!((refused.allowed, refused.reason), (false, Some(Reason::NotAllowed)));
        assert_eq!(refused.answer.as_deref(), Some("NXDOMAIN"));
        let aaaa = lines.iter().find(|l| l.qtype.as_deref() == Some("AAAA")).unwrap();
        assert_eq!(aaaa.answer.as_deref(), Some("NODATA"));
        // Nothing was resolved for real at query time: the test resolver knows no name at all.
        let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }

    #[tokio::test]
    async fn a_full_table_answers_servfail_with_dns_limit() {
        let limits = Limits { max_synthetic: 1, ..Limits::default() };
        let r = rig(&["*.allowed.test"], &[], "", MemSink::default(), limits).await;
        let ask = |name: &str| {
            read_response(&answer_message(&r.session, &query(1, name, 1, None), None).unwrap())
        };
        assert_eq!(ask("a.allowed.test").0, 0);
        assert_eq!(ask("b.allowed.test").0, 2, "SERVFAIL");
        assert_eq!(ask("a.allowed.test").0, 0, "a known name still answers");
        let lines = dns_lines(&r.sink);
        assert_eq!(lines[1].reason, Some(Reason::DnsLimit));
        assert!(!lines[1].allowed);
        assert_eq!(lines[1].answer.as_deref(), Some("SERVFAIL"));
    }

    #[tokio::test]
    async fn malformed_queries_are_audited_and_responses_never_answered() {
        let r = rig(&["allowed.test"], &[], "", MemSink::default(), Limits::default()).await;
        let mut two = query(3, "allowed.test", 1, None);
        two[5] = 2;
        let resp = answer_message(&r.session, &two, None).unwrap();
        assert_eq!(read_response(&resp).0, 1, "FORMERR");
        let mut response = query(3, "allowed.test", 1, None);
        response[2] |= 0x80;
        assert!(answer_message(&r.session, &response, None).is_none());
        let resp = answer_message(&r.session, &query(3, "bad_name!.test", 1, None), None).unwrap();
        assert_eq!(read_response(&resp).0, 3);
        let lines = dns_lines(&r.sink);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.reason == Some(Reason::Malformed) && !l.allowed));
    }

    #[tokio::test]
    async fn a_synthetic_address_in_a_connect_or_url_maps_back_to_its_name() {
        let (up, _) = echo_upstream("127.0.0.1").await;
        let allow = format!("allowed.test:{}", up.port());
        let r = rig(
            &[&allow],
            &["127.0.0.1/32"],
            "allowed.test 127.0.0.1",
            MemSink::default(),
            Limits::default(),
        )
        .await;
        let a = r.session.synthetic.assign("allowed.test").unwrap();
        let (mut s, head) =
            ask(r.addr, &format!("CONNECT {a}:{} HTTP/1.1\r\n\r\n", up.port())).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        drop(s);
        // An address of the range this session never handed out is refused, never dialed.
        let foreign = Ipv4Addr::new(198, 19, 255, 254);
        let foreign = if foreign == a { Ipv4Addr::new(198, 19, 255, 253) } else { foreign };
        let (_s, head) =
            ask(r.addr, &format!("CONNECT {foreign}:{} HTTP/1.1\r\n\r\n", up.port())).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        let (_s, head) = ask(
            r.addr,
            &format!("GET http://{foreign}:{}/ HTTP/1.1\r\nHost: {foreign}\r\n\r\n", up.port()),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let lines: Vec<_> = r.sink.lines().into_iter().map(|(_, l)| l).collect();
        assert!(lines.iter().any(|l| l.host == "allowed.test" && l.allowed), "{lines:?}");
        let refused: Vec<_> = lines.iter().filter(|l| l.host == foreign.to_string()).collect();
        assert_eq!(refused.len(), 2, "{lines:?}");
        assert!(refused.iter().all(|l| l.reason == Some(Reason::IpNotAllowed)));
        let _ = dns::TTL;
    }
}

/// Every head the proxy reads yields exactly one audit line, whatever it is: fuzzed heads
/// (valid, malformed, ambiguous framing, cut short) against a live session, each on its own
/// connection. Lines are written before the answer, so reading the answer to its end is enough.
#[test]
fn every_fuzzed_head_yields_exactly_one_line() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let limits = Limits { header_timeout: Duration::from_secs(20), ..Limits::default() };
    let r = rt.block_on(rig(&["example.test"], &[], "", MemSink::default(), limits));
    let mut runner = TestRunner::deterministic();
    let strategy = super::head::tests::heads();
    for _ in 0..300 {
        let head = strategy.new_tree(&mut runner).unwrap().current();
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
        if end.is_some_and(|e| e != head.len()) {
            continue; // two heads in one: pipelining is covered elsewhere
        }
        let before = r.sink.lines().iter().filter(|(k, _)| *k != "open").count();
        rt.block_on(async {
            let mut s = TcpStream::connect(r.addr).await.unwrap();
            s.write_all(&head).await.unwrap();
            if end.is_none() {
                s.shutdown().await.unwrap();
            }
            let mut resp = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut resp));
            assert!(read.await.is_ok(), "no answer to {:?}", String::from_utf8_lossy(&head));
        });
        let after = r.sink.lines().iter().filter(|(k, _)| *k != "open").count();
        assert_eq!(after - before, 1, "lines for {:?}", String::from_utf8_lossy(&head));
    }
}

/// Idle connections beyond the per-session cap are refused `connection_limit` with a line,
/// without waiting for a head; beyond the daemon-wide cap (a counter shared by two sessions)
/// likewise; a session under both caps is still served.
#[tokio::test]
async fn connection_caps_refuse_idle_floods_with_a_line_and_other_sessions_are_served() {
    let counter = DaemonConnections::isolated();
    let capped = Limits {
        max_connections: 2,
        max_daemon_connections: 3,
        daemon_connections: counter.clone(),
        ..Limits::default()
    };
    let a = rig(&["example.test"], &[], "", MemSink::default(), capped.clone()).await;
    let b = rig(&["example.test"], &[], "", MemSink::default(), capped).await;
    // Two idle connections fill A's cap (they send nothing: the head phase counts).
    let _idle: Vec<TcpStream> =
        vec![TcpStream::connect(a.addr).await.unwrap(), TcpStream::connect(a.addr).await.unwrap()];
    while a.session.stats().active_connections < 2 {
        tokio::task::yield_now().await;
    }
    let (_s, head) = ask(a.addr, "").await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: connection_limit"), "{head}");
    let refused: Vec<_> = a
        .sink
        .lines()
        .into_iter()
        .filter(|(_, l)| l.reason == Some(Reason::ConnectionLimit))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    // B is under its own cap and the daemon's (2 of 3): served (a refusal by policy).
    let (_s, head) = ask(b.addr, "CONNECT pastebin.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: not_allowed"), "{head}");
    // The daemon-wide cap: A's two and one idle connection to B make three (once the
    // refused one has gone).
    while counter.open() > 2 {
        tokio::task::yield_now().await;
    }
    let _held = TcpStream::connect(b.addr).await.unwrap();
    while counter.open() < 3 {
        tokio::task::yield_now().await;
    }
    let (_s, head) = ask(b.addr, "").await;
    assert!(head.contains("X-Airlock-Reason: connection_limit"), "{head}");
    drop(_idle);
    while counter.open() > 1 {
        tokio::task::yield_now().await;
    }
    let (_s, head) = ask(a.addr, "CONNECT pastebin.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 403 "), "slots come back: {head}");
}

/// A resolver that holds every query until the test opens its gate (closes the semaphore),
/// then answers `ip`; counts the queries that reached it.
#[derive(Debug)]
struct GatedResolver {
    gate: tokio::sync::Semaphore,
    calls: AtomicUsize,
    ip: std::net::IpAddr,
}

impl GatedResolver {
    fn new(ip: &str) -> Arc<Self> {
        Arc::new(Self {
            gate: tokio::sync::Semaphore::new(0),
            calls: AtomicUsize::new(0),
            ip: ip.parse().unwrap(),
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn open(&self) {
        self.gate.close();
    }
}

impl Resolver for GatedResolver {
    fn resolve<'a>(&'a self, _name: &'a str) -> resolver::Resolving<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            // Closed = open gate: `acquire` fails at once.
            let _ = self.gate.acquire().await;
            Ok(vec![self.ip])
        })
    }
}

/// [`rig`] with a resolver of the test's own.
async fn rig_resolving(
    allow: &[&str],
    private: &[&str],
    resolver: Arc<dyn Resolver>,
    limits: Limits,
) -> Rig {
    let mut layer = PolicyLayer::new(LayerKind::Operator, "test.toml");
    layer.allow = allow.iter().map(|a| Entry::parse(a, EntryKind::Allow).unwrap()).collect();
    layer.allow_private = private.iter().map(|p| p.parse().unwrap()).collect();
    let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
    let sink = Arc::new(MemSink::default());
    let session = Arc::new(SessionProxy::new(
        Arc::new(policy),
        Arc::clone(&sink) as Arc<dyn AuditSink>,
        resolver,
        limits,
        local_addrs(),
        Identity { repo: "r".into(), repo_path: None, repo_key: None, user_id: Some("u1".into()) },
    ));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(serve_session(l, Arc::clone(&session), rx));
    Rig { addr, sink, session, _stop: tx }
}

fn dns_limit_lines(r: &Rig) -> Vec<AuditLine> {
    r.sink
        .lines()
        .into_iter()
        .filter(|(k, l)| *k != "open" && l.reason == Some(Reason::DnsLimit))
        .map(|(_, l)| l)
        .collect()
}

/// Host-side resolutions past the session's cap, and past the process-wide cap shared by two
/// sessions, are refused `503 dns_limit` with a line once the DNS timeout runs out, and the
/// name is never handed to the resolver. A lookup that timed out for its client keeps its
/// slot until the resolver returns (getaddrinfo cannot be cancelled); then the slots return.
#[tokio::test]
async fn resolutions_past_the_caps_are_refused_dns_limit_and_never_resolved() {
    let (up, hits) = echo_upstream("127.0.0.2").await;
    let resolver = GatedResolver::new("127.0.0.2");
    let daemon = DaemonResolutions::isolated(3);
    let limits = Limits {
        max_resolutions: 2,
        daemon_resolutions: daemon.clone(),
        dns_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let entry = format!("slow.test:{}", up.port());
    let allow: &[&str] = &[&entry];
    let res = Arc::clone(&resolver) as Arc<dyn Resolver>;
    let a = rig_resolving(allow, &["127.0.0.2/32"], Arc::clone(&res), limits.clone()).await;
    let b = rig_resolving(allow, &["127.0.0.2/32"], res, limits).await;
    let req = format!("CONNECT slow.test:{} HTTP/1.1\r\n\r\n", up.port());

    // A's two slots: both lookups hang, their clients give up (504 resolve_failed).
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (addr, req) = (a.addr, req.clone());
            tokio::spawn(async move { ask(addr, &req).await.1 })
        })
        .collect();
    while resolver.calls() < 2 {
        tokio::task::yield_now().await;
    }
    for h in held {
        let head = h.await.unwrap();
        assert!(head.contains("X-Airlock-Reason: resolve_failed"), "{head}");
    }
    // The lookups still run, so A's slots are still taken: a third attempt waits, then 503.
    let (_s, head) = ask(a.addr, &req).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: dns_limit"), "{head}");
    assert_eq!(resolver.calls(), 2, "the refused attempt's name was not resolved");
    let lines = dns_limit_lines(&a);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(!lines[0].allowed && lines[0].layer == Some(LayerKind::None), "{:?}", lines[0]);

    // B has slots of its own but shares the process's three: its first lookup takes the last
    // one, its second is refused.
    let first = tokio::spawn({
        let (addr, req) = (b.addr, req.clone());
        async move { ask(addr, &req).await.1 }
    });
    while resolver.calls() < 3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(daemon.in_flight(), 3);
    let (_s, head) = ask(b.addr, &req).await;
    assert!(head.contains("X-Airlock-Reason: dns_limit"), "{head}");
    assert_eq!(resolver.calls(), 3);
    assert_eq!(dns_limit_lines(&b).len(), 1);
    assert!(first.await.unwrap().contains("X-Airlock-Reason: resolve_failed"));
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was dialed");

    // The resolver returns: every slot comes back, and A is served again.
    resolver.open();
    while daemon.in_flight() > 0 {
        tokio::task::yield_now().await;
    }
    let (_s, head) = ask(a.addr, &req).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(resolver.calls(), 4);
}

/// Past the cap an attempt waits for a slot rather than failing at once: with a long DNS
/// timeout, the second of two attempts on a one-slot session is resolved and served once the
/// first lookup returns.
#[tokio::test]
async fn an_attempt_past_the_cap_waits_for_a_slot() {
    let (up, _hits) = echo_upstream("127.0.0.2").await;
    let resolver = GatedResolver::new("127.0.0.2");
    let limits = Limits {
        max_resolutions: 1,
        daemon_resolutions: DaemonResolutions::isolated(8),
        dns_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let entry = format!("slow.test:{}", up.port());
    let res = Arc::clone(&resolver) as Arc<dyn Resolver>;
    let a = rig_resolving(&[&entry], &["127.0.0.2/32"], res, limits).await;
    let req = format!("CONNECT slow.test:{} HTTP/1.1\r\n\r\n", up.port());
    let ask_a = || {
        let (addr, req) = (a.addr, req.clone());
        tokio::spawn(async move { ask(addr, &req).await })
    };
    let first = ask_a();
    while resolver.calls() < 1 {
        tokio::task::yield_now().await;
    }
    let second = ask_a();
    // Let the second attempt reach the slot queue (it is not answered while it waits).
    while a.session.stats().active_connections < 2 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(resolver.calls(), 1, "the second attempt holds no slot yet");
    resolver.open();
    for h in [first, second] {
        let (_s, head) = h.await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    assert_eq!(resolver.calls(), 2);
    assert!(dns_limit_lines(&a).is_empty());
}

mod gates {
    //! Held attempts ([`super::super::gatehold`]) against the engine: who is held, who is not,
    //! and what a missing decider or the per-session cap does.
    use super::*;
    use crate::gate::{GateBook, Severity};
    use crate::policy::GateEntry;
    use crate::protocol::GateDecision;

    /// Allows and gates `gated.test:PORT` (and `private.test`, which resolves to an address
    /// outside `allow_private`), blocks `blocked.test`.
    async fn gated_rig(book: Option<Arc<GateBook>>) -> (Rig, Arc<AtomicUsize>) {
        let (up, hits) = echo_upstream("127.0.0.2").await;
        let port = up.port();
        let mut layer = PolicyLayer::new(LayerKind::Operator, "test.toml");
        let entries =
            [format!("gated.test:{port}"), "private.test:*".into(), "blocked.test:*".into()];
        layer.allow = entries.iter().map(|a| Entry::parse(a, EntryKind::Allow).unwrap()).collect();
        layer.block = vec![Entry::parse("blocked.test", EntryKind::Block).unwrap()];
        layer.allow_private = vec!["127.0.0.2/32".parse().unwrap()];
        layer.gates = ["gated.test:*", "private.test:*", "blocked.test:*"]
            .iter()
            .map(|g| GateEntry {
                entry: Entry::parse(g, EntryKind::Allow).unwrap(),
                severity: Severity::High,
            })
            .collect();
        layer.gate_timeout_ms = Some(30_000);
        let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
        let sink = Arc::new(MemSink::default());
        let resolver = "gated.test 127.0.0.2\nprivate.test 10.1.2.3\nblocked.test 127.0.0.2";
        let mut session = SessionProxy::new(
            Arc::new(policy),
            Arc::clone(&sink) as Arc<dyn AuditSink>,
            Arc::new(FileResolver::from_text(resolver).unwrap()),
            Limits::default(),
            local_addrs(),
            Identity { repo: "r".into(), repo_path: None, repo_key: None, user_id: None },
        );
        if let Some(book) = book {
            session = session.with_gates(book);
        }
        let session = Arc::new(session);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        tokio::spawn(serve_session(l, Arc::clone(&session), rx));
        (Rig { addr, sink, session, _stop: tx }, hits)
    }

    fn port_of(r: &Rig) -> u16 {
        let g = r.session.policy().layers()[0].allow[0].text().to_owned();
        g.rsplit(':').next().unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn without_a_gate_book_a_gated_target_is_refused_unavailable_and_never_dialed() {
        let (r, hits) = gated_rig(None).await;
        let port = port_of(&r);
        let (_s, head) = ask(r.addr, &format!("CONNECT gated.test:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains("X-Airlock-Reason: gate_unavailable\r\n"), "{head}");
        let (_s, head) =
            ask(r.addr, &format!("GET http://gated.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n"))
                .await;
        assert!(head.contains("X-Airlock-Reason: gate_unavailable\r\n"), "{head}");
        assert_eq!(hits.load(Ordering::SeqCst), 0);
        let closes: Vec<_> = r.sink.lines().into_iter().filter(|(k, _)| *k == "close").collect();
        assert_eq!(closes.len(), 2, "{closes:?}");
        for (_, l) in closes {
            assert_eq!(l.reason, Some(Reason::GateUnavailable));
            assert_eq!(l.rule.as_deref(), Some("gated.test:*"));
            assert!(l.addr.is_none() && !l.allowed, "{l:?}");
        }
    }

    #[tokio::test]
    async fn only_what_the_policy_and_the_address_guard_allow_is_ever_held() {
        let book = GateBook::new(4);
        let (r, hits) = gated_rig(Some(Arc::clone(&book))).await;
        let (_s, head) = ask(r.addr, "CONNECT blocked.test:443 HTTP/1.1\r\n\r\n").await;
        assert!(head.contains("X-Airlock-Reason: blocked\r\n"), "{head}");
        let (_s, head) = ask(r.addr, "CONNECT private.test:443 HTTP/1.1\r\n\r\n").await;
        assert!(head.contains("X-Airlock-Reason: private_address\r\n"), "{head}");
        assert!(book.list().1.is_empty(), "a refused attempt opened a gate");
        assert_eq!(book.list().0, 0, "the book never changed");
        assert_eq!(hits.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_approved_hold_proceeds_and_the_cap_refuses_the_rest_with_gate_limit() {
        let book = GateBook::new(1);
        let (r, hits) = gated_rig(Some(Arc::clone(&book))).await;
        let port = port_of(&r);
        let mut held = TcpStream::connect(r.addr).await.unwrap();
        held.write_all(format!("CONNECT gated.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (version, gates) = book.wait_change(0, Duration::from_secs(10)).await;
        assert!(version > 0 && gates.len() == 1, "{gates:?}");
        assert_eq!(gates[0].severity, "high");
        // The session's one hold slot is taken: the next gated attempt is refused at once.
        let (_s, head) = ask(r.addr, &format!("CONNECT gated.test:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains("X-Airlock-Reason: gate_limit\r\n"), "{head}");
        assert_eq!(hits.load(Ordering::SeqCst), 0, "dialed before the decision");
        let d = GateDecision {
            id: gates[0].id.clone(),
            digest: gates[0].digest.clone(),
            approve: true,
            note: String::new(),
            by: "t@example.test".into(),
            relay: None,
        };
        book.decide(&d, "2026-12-04T00:00:00.000Z".into()).unwrap();
        let mut head = vec![0u8; 39];
        held.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200 Connection established\r\n\r\n");
        held.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        held.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        let steps: Vec<_> = r
            .sink
            .lines()
            .into_iter()
            .filter(|(k, l)| *k == "append" && l.method == "GATE")
            .map(|(_, l)| l.gate.unwrap().step)
            .collect();
        use crate::audit::GateStep;
        assert_eq!(steps, [GateStep::Requested, GateStep::Approved]);
    }
}
