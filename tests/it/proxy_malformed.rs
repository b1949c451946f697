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
