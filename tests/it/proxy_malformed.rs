//! Every head the proxy reads is audited (issue 14): a head cut off before its final CRLF CRLF
//! and the first requests hyper would refuse with a bare `400`/`431` — a double
//! `Content-Length`, `Transfer-Encoding: xchunked`, `Content-Length: abc`, too many header
//! lines — each get exactly one audit line and the proxy's own refusal, on the CONNECT path
//! and the plain-HTTP path. Raw TCP clients against `airlockd proxy` on loopback; the allowed
//! names resolve only through the test resolver, and the upstream must never be dialed.

use std::io::{Read, Write};
use std::net::Shutdown;

use crate::proxy_support::{ProxyProc, Serve, Upstream, read_head};
use crate::support::World;

/// The proxy and its one allowed upstream, `heads.test` on `ip` (one address per test: the
/// tests run in parallel).
fn proxy(world: &World, tag: &str, ip: &str) -> (ProxyProc, Upstream) {
    let serve = Serve::Http { name: "heads".into(), root: None };
    let up = Upstream::start(&format!("{ip}:80"), serve, None);
    let proxy = ProxyProc::start(
        world,
        tag,
        &format!("[network]\nallow = [\"heads.test\"]\nallow_private = [\"{ip}/32\"]\n"),
        &format!("heads.test {ip}\n"),
        &[],
    );
    (proxy, up)
}

/// Sends `bytes`, half-closes, and returns the whole response.
fn send_and_half_close(proxy: &ProxyProc, bytes: &[u8]) -> String {
    let mut s = proxy.connect();
    s.write_all(bytes).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).into_owned()
}

#[test]
fn a_head_closed_before_its_end_is_audited_as_incomplete() {
    let world = World::new();
    let (proxy, up) = proxy(&world, "incomplete", "127.0.1.41");
    let cut: [&[u8]; 4] = [
        b"GET http://heads.test/ HTTP/1.1\r\nHost: heads.test",
        b"GET http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\n",
        b"CONNECT heads.test:443 HTTP/1.1\r\n",
        b"CONNECT heads.test:443 HTTP/1.1\r\nHost: heads.test:443\r\n\r",
    ];
    for bytes in cut {
        let resp = send_and_half_close(&proxy, bytes);
        let shown = String::from_utf8_lossy(bytes);
        assert!(resp.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{shown:?} → {resp}");
        assert!(resp.contains("X-Airlock-Reason: incomplete_head\r\n"), "{shown:?} → {resp}");
    }
    // A connection that sends nothing is not an attempt: no line.
    drop(proxy.connect());
    let lines = proxy.wait_audit(|l| l.len() >= cut.len());
    assert_eq!(lines.len(), cut.len(), "one line per cut-off head: {lines:#?}");
    for l in &lines {
        assert_eq!(l["reason"], "incomplete_head", "{l}");
        assert_eq!(l["allowed"], false, "{l}");
        assert_eq!(l["layer"], "none", "{l}");
    }
    let methods: Vec<_> = lines.iter().map(|l| l["method"].as_str().unwrap()).collect();
    assert_eq!(methods.iter().filter(|m| **m == "CONNECT").count(), 2, "{methods:?}");
    assert_eq!(up.hits(), 0, "a cut-off head must never be forwarded");
}

#[test]
fn first_requests_hyper_would_refuse_are_audited() {
    let world = World::new();
    let (proxy, up) = proxy(&world, "framing", "127.0.1.42");
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let bad = [
        "POST http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\nContent-Length: 1\r\n\
         Content-Length: 2\r\n\r\nab"
            .to_owned(),
        "POST http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\nTransfer-Encoding: xchunked\r\n\r\n"
            .to_owned(),
        "POST http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\nContent-Length: abc\r\n\r\n"
            .to_owned(),
        "POST http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\nTransfer-Encoding: chunked\r\n\
         Content-Length: 3\r\n\r\nabc"
            .to_owned(),
        "POST http://heads.test/ HTTP/1.0\r\nHost: heads.test\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_owned(),
        format!("GET http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\n{many}\r\n"),
        // The CONNECT path applies the same framing rules.
        "CONNECT heads.test:443 HTTP/1.1\r\nContent-Length: abc\r\n\r\n".to_owned(),
    ];
    for req in &bad {
        let (_s, head) = proxy.ask(req);
        let first = req.lines().next().unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{first} → {head}");
        assert!(head.contains("X-Airlock-Reason: malformed\r\n"), "{req:?} → {head}");
        assert!(head.contains("X-Airlock-Layer: none\r\n"), "{req:?} → {head}");
    }
    let lines = proxy.wait_audit(|l| l.len() >= bad.len());
    assert_eq!(lines.len(), bad.len(), "one malformed line per attempt: {lines:#?}");
    for l in &lines {
        assert_eq!(l["reason"], "malformed", "{l}");
        assert_eq!(l["allowed"], false, "{l}");
        assert!(l["host"].as_str().unwrap().contains("heads.test"), "{l}");
    }
    assert_eq!(up.hits(), 0, "a refused head must never be forwarded");

    // A well-framed first request on the same proxy still goes through: the rules refuse
    // ambiguity, not bodies.
    let (mut s, head) = proxy.ask(
        "POST http://heads.test/ HTTP/1.1\r\nHost: heads.test\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\nok",
    );
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    let lines = proxy.wait_audit(|l| l.len() > bad.len());
    assert_eq!(lines.len(), bad.len() + 1, "{lines:#?}");
    assert_eq!(lines[bad.len()]["allowed"], true, "{:#}", lines[bad.len()]);
    assert_eq!(up.hits(), 1);
}

#[test]
fn a_response_is_read_by_a_client_that_only_half_closed() {
    // The client of a cut-off head may still be listening: it gets the body naming the cause.
    let world = World::new();
    let (proxy, _up) = proxy(&world, "halfclose", "127.0.1.43");
    let resp = send_and_half_close(&proxy, b"GET http://heads.test/ HTTP/1.1\r\nHo");
    assert!(resp.contains("before the request head's closing CRLF CRLF"), "{resp}");
    let mut s = proxy.connect();
    s.write_all(b"GET http://heads.test/ HTTP/1.1\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let head = read_head(&mut s);
    assert!(head.contains("X-Airlock-Reason: incomplete_head\r\n"), "{head}");
}

/// Reads one response (head plus its `Content-Length` body) from a kept-alive connection.
fn read_response(s: &mut std::net::TcpStream) -> (String, String) {
    let head = read_head(s);
    let len = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("Content-Length: ").or_else(|| l.strip_prefix("content-length: "))
        })
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

const GOOD: &str = "GET http://heads.test/one HTTP/1.1\r\nHost: heads.test\r\n\r\n";

#[test]
fn later_requests_on_a_kept_alive_connection_are_audited_too() {
    let world = World::new();
    let (proxy, up) = proxy(&world, "later", "127.0.1.44");
    let chunked = "POST http://heads.test/up HTTP/1.1\r\nHost: heads.test\r\n\
                   Transfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: v\r\n\r\n";
    let bad = [
        "POST http://heads.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "POST http://heads.test/ HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
        "POST http://heads.test/ HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        "GET http://a%2ecom/ HTTP/1.1\r\n\r\n",
        "GET http://heads.test/ HTTP/1.1\nHost: x\r\n\r\n",
    ];
    let mut expected = 0;
    for (i, req) in bad.iter().enumerate() {
        let mut s = proxy.connect();
        // One good request (after a chunked one, every other time: the gate must frame it),
        // answered, then the bad one on the same connection.
        let first = if i % 2 == 0 { GOOD } else { chunked };
        s.write_all(first.as_bytes()).unwrap();
        let (head, _) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200 "), "{first:?} → {head}");
        s.write_all(req.as_bytes()).unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{req:?} → {head}");
        assert!(head.contains("X-Airlock-Reason: malformed\r\n"), "{req:?} → {head}");
        expected += 2;
        let lines = proxy.wait_audit(|l| l.len() >= expected);
        assert_eq!(lines.len(), expected, "{req:?}: {lines:#?}");
        assert_eq!(lines[expected - 2]["allowed"], true, "{:#}", lines[expected - 2]);
        assert_eq!(lines[expected - 1]["reason"], "malformed", "{:#}", lines[expected - 1]);
    }

    // Pipelined: a good request and a bad one in one write get the good response, then the
    // refusal, and two lines.
    let mut s = proxy.connect();
    s.write_all(format!("{GOOD}{}", bad[0]).as_bytes()).unwrap();
    let (head, body) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 200 ") && body.contains("hello from heads"), "{head}");
    let head = read_head(&mut s);
    assert!(head.contains("X-Airlock-Reason: malformed\r\n"), "{head}");
    expected += 2;

    // A later head cut off by the client is `incomplete_head`.
    let mut s = proxy.connect();
    s.write_all(GOOD.as_bytes()).unwrap();
    let _ = read_response(&mut s);
    s.write_all(b"GET http://heads.test/two HTTP/1.1\r\nHo").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let head = read_head(&mut s);
    assert!(head.contains("X-Airlock-Reason: incomplete_head\r\n"), "{head}");
    expected += 2;

    // Well-framed later requests still flow, each on its own line.
    let mut s = proxy.connect();
    for _ in 0..3 {
        s.write_all(GOOD.as_bytes()).unwrap();
        let (head, _) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    }
    drop(s);
    expected += 3;
    let lines = proxy.wait_audit(|l| l.len() >= expected);
    assert_eq!(lines.len(), expected, "{lines:#?}");
    let refused = lines.iter().filter(|l| l["allowed"] == false).count();
    assert_eq!(refused, bad.len() + 2, "{lines:#?}");
    // Only the good requests reached the upstream.
    assert_eq!(up.hits(), expected - refused);
}
