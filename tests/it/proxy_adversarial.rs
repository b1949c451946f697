//! Adversarial classes against `airlockd proxy`: CONNECT target parsing, host forms, SNI,
//! rebinding and mixed resolver answers, slow drips and floods, the tunnel cap, an unwritable
//! audit log, and a writer killed mid-tunnel. Sentinels sit on addresses that must never be
//! dialed; the resolver's query log proves denied names are never resolved.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::proxy_support::{ProxyProc, Serve, TestPki, Upstream, lines_for};
use crate::support::World;

fn connect_req(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
}

#[test]
fn connect_target_parsing_is_strict() {
    let world = World::new();
    let up = Upstream::start("127.0.1.13:443", Serve::Echo, None);
    let proxy = ProxyProc::start(
        &world,
        "parse",
        "[network]\nallow = [\"parse.test\"]\nallow_private = [\"127.0.1.13/32\"]\n",
        "parse.test 127.0.1.13\n",
        &[],
    );
    let bad = [
        "CONNECT parse.test HTTP/1.1\r\n\r\n",
        "CONNECT user@parse.test:443 HTTP/1.1\r\n\r\n",
        "CONNECT user:pw@parse.test:443 HTTP/1.1\r\n\r\n",
        "CONNECT https://parse.test:443/ HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:443/x HTTP/1.1\r\n\r\n",
        "CONNECT  parse.test:443 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:443  HTTP/1.1\r\n\r\n",
        "CONNECT\tparse.test:443 HTTP/1.1\r\n\r\n",
        " CONNECT parse.test:443 HTTP/1.1\r\n\r\n",
        "connect parse.test:443 HTTP/1.1\r\n\r\n",
        "Connect parse.test:443 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:443 HTTP/1.2\r\n\r\n",
        "CONNECT parse.test:443 HTTP/2\r\n\r\n",
        "CONNECT parse.test:443\r\n\r\n",
        "CONNECT parse.test:0 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:65536 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:-1 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:44x3 HTTP/1.1\r\n\r\n",
        "CONNECT parse.test: HTTP/1.1\r\n\r\n",
        "CONNECT parse.test:443 HTTP/1.1\nHost: x\r\n\r\n",
        "CONNECT parse.test:443 HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
    ];
    for req in bad {
        let (_s, head) = proxy.ask(req);
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{req:?} → {head}");
        assert!(head.contains("X-Airlock-Reason: malformed\r\n"), "{req:?} → {head}");
    }
    let lines = proxy.wait_audit(|l| l.len() >= bad.len());
    assert_eq!(lines.len(), bad.len(), "one malformed line per attempt: {lines:#?}");
    assert!(lines.iter().all(|l| l["reason"] == "malformed" && l["allowed"] == false));
    assert_eq!(up.hits(), 0);

    // HTTP/1.0 CONNECT is valid and answered in kind.
    let (_s, head) = proxy.ask("CONNECT parse.test:443 HTTP/1.0\r\n\r\n");
    assert_eq!(head, "HTTP/1.0 200 Connection established\r\n\r\n");
    // Only that valid request reached the resolver: malformed targets are never resolved.
    assert_eq!(proxy.queries(), ["parse.test"], "malformed targets must never be resolved");
}

#[test]
fn host_forms_are_canonicalized_before_any_dns() {
    let world = World::new();
    let up = Upstream::start("127.0.1.14:443", Serve::Echo, None);
    let sentinel = Upstream::sentinel("127.0.1.15:443");
    let proxy = ProxyProc::start(
        &world,
        "forms",
        "[network]\nallow = [\"forms.test\"]\nallow_private = [\"127.0.1.14/32\"]\n",
        "forms.test 127.0.1.14\n",
        &[],
    );
    for ok in ["FORMS.Test:443", "forms.test.:443", "forms.TEST.:443"] {
        let (_s, head) = proxy.ask(&connect_req(ok));
        assert!(head.starts_with("HTTP/1.1 200 "), "{ok} → {head}");
    }
    for malformed in [
        "2130706433:443",
        "0177.0.0.1:443",
        "0x7f.1:443",
        "127.1:443",
        "forms%2etest:443",
        "[fe80::1%25lo]:443",
        "::1:443",
        "[127.0.1.15]:443",
    ] {
        let (_s, head) = proxy.ask(&connect_req(malformed));
        assert!(head.starts_with("HTTP/1.1 400 "), "{malformed} → {head}");
    }
    for (denied, reason) in [
        ("127.0.1.15:443", "ip_not_allowed"),
        ("[::ffff:127.0.1.15]:443", "ip_not_allowed"),
        ("[::ffff:7f00:10f]:443", "ip_not_allowed"),
        ("[::1]:443", "ip_not_allowed"),
        ("förms.test:443", "not_allowed"),
        ("pastebin.com:443", "not_allowed"),
    ] {
        let (_s, head) = proxy.ask(&connect_req(denied));
        assert!(
            head.starts_with("HTTP/1.1 403 Forbidden by airlock policy\r\n"),
            "{denied} → {head}"
        );
        assert!(head.contains(&format!("X-Airlock-Reason: {reason}\r\n")), "{denied} → {head}");
    }
    let lines = proxy.wait_audit(|l| l.iter().filter(|x| x["host"] == "forms.test").count() >= 3);
    let allowed = lines_for(&lines, "forms.test");
    assert_eq!(allowed.len(), 3, "every spelling is recorded as the canonical name");
    let uni: Vec<_> = lines.iter().filter(|l| l["host"] == "xn--frms-5qa.test").collect();
    assert_eq!(uni.len(), 1, "Unicode names are recorded as A-labels: {lines:#?}");
    assert_eq!(sentinel.hits(), 0, "a refused address was dialed");
    let queries = proxy.queries();
    assert!(!queries.is_empty() && queries.iter().all(|q| q == "forms.test"), "{queries:?}");
    assert_eq!(up.hits_at_least(3), 3);
}

/// Captures a rustls ClientHello for `name`.
fn client_hello(pki: &TestPki, name: &str) -> (rustls::ClientConnection, Vec<u8>) {
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(pki.client_config(), server).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    (conn, out)
}

/// Re-frames one handshake record's payload into records of `size` bytes.
fn refragment(tls: &[u8], size: usize) -> Vec<u8> {
    let len = usize::from(u16::from_be_bytes([tls[3], tls[4]]));
    let mut out = Vec::new();
    for chunk in tls[5..5 + len].chunks(size) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&tls[5 + len..]);
    out
}

/// Reads until EOF (or error) and says whether the proxy closed without sending anything.
fn closed_silently(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf.is_empty()
}

#[test]
fn sni_must_match_the_connect_host() {
    let world = World::new();
    let pki = TestPki::new(&["sni.test", "pastebin.com"]);
    let up = Upstream::start(
        "127.0.1.16:443",
        Serve::Http { name: "sni.test".into(), root: None },
        Some(pki.server_config()),
    );
    let proxy = ProxyProc::start(
        &world,
        "sni",
        "[network]\nallow = [\"sni.test\"]\nallow_private = [\"127.0.1.16/32\"]\n",
        "sni.test 127.0.1.16\n",
        &[],
    );
    // SNI naming another host (domain fronting at the TLS layer).
    let (mut s, head) = proxy.ask(&connect_req("sni.test:443"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let (_c, hello) = client_hello(&pki, "pastebin.com");
    s.write_all(&hello).unwrap();
    assert!(closed_silently(&mut s), "mismatched SNI got an answer");

    // No SNI: a TLS hello for an IP address, and something that is not TLS at all.
    let (mut s, _) = proxy.ask(&connect_req("sni.test:443"));
    let server = rustls::pki_types::ServerName::IpAddress(
        "127.0.1.16".parse::<std::net::IpAddr>().unwrap().into(),
    );
    let mut conn = rustls::ClientConnection::new(pki.client_config(), server).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    s.write_all(&hello).unwrap();
    assert!(closed_silently(&mut s));
    let (mut s, _) = proxy.ask(&connect_req("sni.test:443"));
    s.write_all(b"GET / HTTP/1.1\r\nHost: sni.test\r\n\r\n").unwrap();
    assert!(closed_silently(&mut s));

    // A ClientHello split across many TLS records and TCP segments is reassembled and the
    // handshake completes end to end.
    let (mut s, _) = proxy.ask(&connect_req("sni.test:443"));
    let (conn, hello) = client_hello(&pki, "sni.test");
    let split = refragment(&hello, 40);
    for piece in split.chunks(97) {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(3));
    }
    let mut tls = rustls::StreamOwned::new(conn, s);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: sni.test\r\n\r\n").unwrap();
    let mut got = vec![0u8; 4096];
    let n = tls.read(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    drop(tls);

    let lines = proxy.wait_audit(|l| l.len() >= 4);
    let reasons: Vec<_> = lines.iter().map(|l| l["reason"].as_str().unwrap_or("-")).collect();
    assert_eq!(reasons.iter().filter(|r| **r == "sni_mismatch").count(), 1, "{lines:#?}");
    assert_eq!(reasons.iter().filter(|r| **r == "sni_missing").count(), 2, "{lines:#?}");
    for l in lines.iter().filter(|l| l["reason"].is_string() && l["reason"] != "allowed") {
        assert_eq!(l["allowed"], false);
        assert_eq!(l["bytes_sent"], 0, "nothing may be forwarded before the SNI check");
        // No entry decided the refusal, so no `rule`; the SNI seen, when the hello had one.
        assert!(l.get("rule").is_none(), "{l}");
        let want_sni = if l["reason"] == "sni_mismatch" { Some("pastebin.com") } else { None };
        assert_eq!(l.get("sni").and_then(|s| s.as_str()), want_sni, "{l}");
    }
    assert!(up.hits_at_least(1) >= 1);
}

#[test]
fn rebinding_and_mixed_answers_are_checked_every_time() {
    let world = World::new();
    let up = Upstream::start("127.0.1.17:443", Serve::Echo, None);
    let rebind_sentinel = Upstream::sentinel("127.0.1.18:443");
    let mixed_sentinel = Upstream::sentinel("127.0.1.20:443");
    let blocked_sentinel = Upstream::sentinel("127.0.1.21:443");
    let proxy = ProxyProc::start(
        &world,
        "rebind",
        "[network]\nallow = [\"rebind.test\", \"mixed.test\", \"blk.test\"]\n\
         block = [\"127.0.1.21/32\"]\n\
         allow_private = [\"127.0.1.17/32\", \"127.0.1.21/32\"]\n",
        "rebind.test 127.0.1.17 | 127.0.1.18\n\
         mixed.test 127.0.1.17 127.0.1.20\n\
         blk.test 127.0.1.17 127.0.1.21\n",
        &[],
    );
    let (first, head) = proxy.ask(&connect_req("rebind.test:443"));
    assert!(head.starts_with("HTTP/1.1 200 "), "first answer is allowed: {head}");
    drop(first);
    let (_s, head) = proxy.ask(&connect_req("rebind.test:443"));
    assert!(head.contains("X-Airlock-Reason: private_address\r\n"), "rebound: {head}");
    let (_s, head) = proxy.ask(&connect_req("mixed.test:443"));
    assert!(head.contains("X-Airlock-Reason: private_address\r\n"), "mixed: {head}");
    let (_s, head) = proxy.ask(&connect_req("blk.test:443"));
    assert!(head.contains("X-Airlock-Reason: blocked_address\r\n"), "blocked: {head}");

    assert_eq!(rebind_sentinel.hits(), 0);
    assert_eq!(mixed_sentinel.hits(), 0);
    assert_eq!(blocked_sentinel.hits(), 0);
    assert_eq!(
        up.hits_at_least(1),
        1,
        "a refused attempt dials nothing, not even its good answers"
    );
    let q = proxy.queries();
    assert_eq!(q.iter().filter(|n| *n == "rebind.test").count(), 2, "resolved once per attempt");
    let lines = proxy.wait_audit(|l| l.len() >= 4);
    let refused: Vec<_> = lines
        .iter()
        .filter(|l| l["reason"] == "private_address" || l["reason"] == "blocked_address")
        .collect();
    assert_eq!(refused.len(), 3, "{lines:#?}");
    assert!(refused.iter().all(|l| l["addr"].is_null()), "{refused:#?}");
    // Each refusal lists exactly the answers the guard refused, never the good one.
    let refused_addrs = |host: &str| -> Vec<String> {
        let l = refused.iter().find(|l| l["host"] == host).unwrap();
        l["refused_addrs"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect()
    };
    assert_eq!(refused_addrs("rebind.test"), ["127.0.1.18"]);
    assert_eq!(refused_addrs("mixed.test"), ["127.0.1.20"]);
    assert_eq!(refused_addrs("blk.test"), ["127.0.1.21"]);
    let blocked = refused.iter().find(|l| l["host"] == "blk.test").unwrap();
    assert_eq!(blocked["rule"], "127.0.1.21/32", "the block entry that refused: {blocked}");
}

#[test]
fn drips_floods_and_the_tunnel_cap() {
    let world = World::new();
    let up = Upstream::start("127.0.1.22:7443", Serve::Echo, None);
    let proxy = ProxyProc::start(
        &world,
        "caps",
        "[network]\nallow = [\"cap.test:7443\"]\nallow_private = [\"127.0.1.22/32\"]\n",
        "cap.test 127.0.1.22\n",
        &["--header-timeout", "1s", "--max-tunnels", "2"],
    );
    // Slow drip: a byte at a time, never finishing the head.
    let mut s = proxy.connect();
    let mut answer = String::new();
    for b in b"CONNECT cap.test:7443 HTTP/1.1\r\nX-Drip: aaaaaaaaaaaaaaaaaaaa" {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");

    // Header floods: one huge header, and many small ones.
    let big = format!("CONNECT cap.test:7443 HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    let (_s, head) = proxy.ask(&big);
    assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
    let mut many = String::from("CONNECT cap.test:7443 HTTP/1.1\r\n");
    for i in 0..2000 {
        many.push_str(&format!("X-{i}: y\r\n"));
    }
    many.push_str("\r\n");
    let (_s, head) = proxy.ask(&many);
    assert!(head.starts_with("HTTP/1.1 431 "), "{head}");

    // The cap: two tunnels open, the third refused, a slot freed, a fourth accepted.
    let (mut t1, h1) = proxy.ask(&connect_req("cap.test:7443"));
    let (t2, h2) = proxy.ask(&connect_req("cap.test:7443"));
    assert!(h1.starts_with("HTTP/1.1 200 ") && h2.starts_with("HTTP/1.1 200 "), "{h1}{h2}");
    t1.write_all(b"echo").unwrap();
    let mut e = [0u8; 4];
    t1.read_exact(&mut e).unwrap();
    assert_eq!(&e, b"echo");
    let (_s, h3) = proxy.ask(&connect_req("cap.test:7443"));
    assert!(h3.starts_with("HTTP/1.1 503 "), "{h3}");
    assert!(h3.contains("X-Airlock-Reason: tunnel_limit\r\n"), "{h3}");
    drop(t1);
    let mut reopened = false;
    for _ in 0..100 {
        let (_s, h4) = proxy.ask(&connect_req("cap.test:7443"));
        if h4.starts_with("HTTP/1.1 200 ") {
            reopened = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reopened, "a closed tunnel must free its slot");
    drop(t2);
    let lines = proxy.wait_audit(|l| l.iter().any(|x| x["reason"] == "tunnel_limit"));
    assert!(lines.iter().filter(|l| l["reason"] == "malformed").count() >= 3, "{lines:#?}");
    assert!(lines.iter().any(|l| l["reason"] == "tunnel_limit" && l["allowed"] == false));
    assert!(up.hits_at_least(3) >= 3, "the upstream saw {} connections", up.hits());
}

#[test]
fn unwritable_audit_log_fails_closed() {
    let world = World::new();
    let proxy = ProxyProc::start(&world, "ro", "[network]\nallow = [\"ro.test\"]\n", "", &[]);
    // Make today's audit file impossible to open (a directory in its place; works as root).
    let today = airlock::audit::utc_date(std::time::SystemTime::now());
    std::fs::create_dir_all(proxy.log_dir.join(format!("audit-{today}.jsonl"))).unwrap();
    let (_s, head) = proxy.ask(&connect_req("pastebin.com:443"));
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: audit_unavailable\r\n"), "{head}");

    // A log directory that cannot be created at all: the proxy refuses to start.
    let file = world.write(world.tmp.path().join("not-a-dir"), "x");
    let cfg = world.write(world.tmp.path().join("ro2.toml"), "[network]\nallow = [\"ro.test\"]\n");
    let run = world
        .airlockd(world.tmp.path())
        .args(["proxy", "--repo-name", "demo", "--listen", "127.0.0.1:0"])
        .args(["--config".as_ref(), cfg.as_os_str()])
        .args(["--log-dir".as_ref(), file.join("logs").as_os_str()])
        .run();
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("audit log"), "{}", run.stderr());
}

#[test]
fn kill_9_mid_tunnel_then_restart_settles_exactly_once() {
    let world = World::new();
    let _up = Upstream::start("127.0.1.23:7443", Serve::Echo, None);
    let cfg = world.write(
        world.tmp.path().join("kill.toml"),
        "[network]\nallow = [\"kill.test:7443\"]\nallow_private = [\"127.0.1.23/32\"]\n",
    );
    let res = world.write(world.tmp.path().join("kill.resolver"), "kill.test 127.0.1.23\n");
    let logs = world.tmp.path().join("kill-logs");
    let mut first = ProxyProc::start_with(&world, &cfg, &res, &logs, &[]);
    let (mut t, head) = first.ask(&connect_req("kill.test:7443"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    t.write_all(b"in flight").unwrap();
    let mut e = [0u8; 9];
    t.read_exact(&mut e).unwrap();
    first.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    assert!(first.audit().is_empty(), "no final line can exist yet");
    drop(first);

    for _ in 0..2 {
        let again = ProxyProc::start_with(&world, &cfg, &res, &logs, &[]);
        let lines = again.audit();
        let interrupted: Vec<_> =
            lines.iter().filter(|l| l["interrupted"] == true && l["host"] == "kill.test").collect();
        assert_eq!(interrupted.len(), 1, "{lines:#?}");
        assert_eq!(interrupted[0]["port"], 7443);
        drop(again);
    }
}
