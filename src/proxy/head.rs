//! Reading and strictly checking the first request head on a proxy connection: bounded in size
//! and time (slow-drip and flood defenses), CRLF-only framing, no obs-fold, token method names
//! (RFC 9112 §2–§5). CONNECT is answered by our own code; anything else is handed to hyper
//! together with the bytes already read.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Why a head could not be read.
#[derive(Debug)]
pub enum HeadError {
    /// The peer closed before sending anything: not an attempt, nothing to log.
    Empty,
    /// The head exceeded the size cap (431).
    TooLarge,
    /// The head did not complete within the header timeout (408).
    Timeout,
    /// The peer closed or failed mid-head.
    Io,
}

/// Reads until the end of the head (`CRLF CRLF`) into `buf`; returns the head length. Bytes
/// after the head (a pipelined body, an eager ClientHello) stay in `buf` after it.
pub async fn read_head(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
    timeout: Duration,
) -> Result<usize, HeadError> {
    let read = async {
        let mut chunk = [0u8; 2048];
        loop {
            let n = sock.read(&mut chunk).await.map_err(|_| HeadError::Io)?;
            if n == 0 {
                return Err(if buf.is_empty() { HeadError::Empty } else { HeadError::Io });
            }
            let from = buf.len().saturating_sub(3);
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = find_end(&buf[from..]) {
                let end = from + i + 4;
                if end > max {
                    return Err(HeadError::TooLarge);
                }
                return Ok(end);
            }
            if buf.len() >= max {
                return Err(HeadError::TooLarge);
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(HeadError::Timeout),
    }
}

fn find_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

/// The first request line, classified.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestKind<'a> {
    /// `CONNECT authority HTTP/1.x`.
    Connect { authority: &'a str, http10: bool },
    /// Any other method: plain-HTTP proxying (hyper takes over).
    Other { method: &'a str, target: &'a str },
}

/// Checks the whole head strictly and classifies its request line. The error says what was
/// wrong in words an agent's operator can act on (it becomes the 400 body).
pub fn parse_head(head: &[u8]) -> Result<RequestKind<'_>, String> {
    let text =
        std::str::from_utf8(head).map_err(|_| "request head is not valid UTF-8".to_owned())?;
    let body = text.strip_suffix("\r\n\r\n").ok_or("request head does not end in CRLF CRLF")?;
    // Every line break must be CRLF: a bare LF or CR is a request-smuggling vector.
    let mut lines = body.split("\r\n");
    if lines.clone().any(|l| l.contains('\n') || l.contains('\r')) {
        return Err("bare LF or CR in the request head; lines must end in CRLF".into());
    }
    let line = lines.next().unwrap_or("");
    for h in lines {
        check_header_line(h)?;
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!(
            "malformed request line {:?}: expected METHOD SP TARGET SP HTTP/1.1",
            cap(line)
        ));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(format!("malformed method {:?}", cap(method)));
    }
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("empty request target or control characters in it".into());
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        other => return Err(format!("unsupported protocol version {:?}", cap(other))),
    };
    if method == "CONNECT" {
        return Ok(RequestKind::Connect { authority: target, http10 });
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(format!("method names are case-sensitive: send CONNECT, not {method:?}"));
    }
    Ok(RequestKind::Other { method, target })
}

fn check_header_line(h: &str) -> Result<(), String> {
    if h.starts_with([' ', '\t']) {
        return Err("obsolete header line folding is not accepted (RFC 9112 §5.2)".into());
    }
    let Some((name, value)) = h.split_once(':') else {
        return Err(format!("header line without a colon: {:?}", cap(h)));
    };
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(format!("invalid header name {:?}", cap(name)));
    }
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(format!("control character in header {name:?}"));
    }
    Ok(())
}

/// RFC 9110 §5.6.2 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Cuts echoed input short so a 400 body stays small.
fn cap(s: &str) -> &str {
    match s.char_indices().nth(120) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classifies_connect_and_others() {
        let h = b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n";
        assert_eq!(
            parse_head(h).unwrap(),
            RequestKind::Connect { authority: "example.test:443", http10: false }
        );
        let h = b"CONNECT example.test:443 HTTP/1.0\r\n\r\n";
        assert!(matches!(parse_head(h).unwrap(), RequestKind::Connect { http10: true, .. }));
        let h = b"GET http://example.test/ HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            parse_head(h).unwrap(),
            RequestKind::Other { method: "GET", target: "http://example.test/" }
        );
    }

    #[test]
    fn rejects_sloppy_heads() {
        for bad in [
            &b"connect example.test:443 HTTP/1.1\r\n\r\n"[..],
            b"CONNECT  example.test:443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.test:443  HTTP/1.1\r\n\r\n",
            b" CONNECT example.test:443 HTTP/1.1\r\n\r\n",
            b"CONNECT\texample.test:443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.test:443 HTTP/2.0\r\n\r\n",
            b"CONNECT example.test:443\r\n\r\n",
            b"CONNECT example.test:443 HTTP/1.1\nHost: x\r\n\r\n",
            b"CONNECT example.test:443 HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"CONNECT example.test:443 HTTP/1.1\r\nHost : x\r\n\r\n",
            b"CONNECT example.test:443 HTTP/1.1\r\nNoColon\r\n\r\n",
            b"CONNECT example.test:443 HTTP/1.1\r\nX: a\x00b\r\n\r\n",
            b"\xffCONNECT example.test:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "accepted {:?}", String::from_utf8_lossy(bad));
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let mut v = s.into_bytes();
            v.extend_from_slice(b"\r\n\r\n");
            let _ = parse_head(&v);
        }
    }
}
