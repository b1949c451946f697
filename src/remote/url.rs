//! The review server's address as `airlock login --server URL` accepts it: `https://host[:port]`
//! anywhere, `http://` only for a loopback host. Parsed by hand (the grammar allowed is tiny)
//! and stored normalized as `scheme://host:port`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a server URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct UrlError {
    pub reason: String,
}

fn refuse(reason: impl Into<String>) -> UrlError {
    UrlError { reason: reason.into() }
}

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// The review server's host part: an address literal or a DNS name (lowercase ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    Name(String),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Name(n) => f.write_str(n),
        }
    }
}

impl Host {
    /// A loopback literal (127.0.0.0/8, `::1`) or the name `localhost`.
    pub fn is_loopback(&self) -> bool {
        match self {
            Host::Ip(IpAddr::V4(a)) => a.is_loopback(),
            Host::Ip(IpAddr::V6(a)) => *a == Ipv6Addr::LOCALHOST,
            Host::Name(n) => n == "localhost",
        }
    }
}

/// A parsed, normalized review server URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    pub scheme: Scheme,
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl ServerUrl {
    /// Parses `https://host[:port][/]` or (loopback only) `http://host[:port][/]`.
    pub fn parse(input: &str) -> Result<Self, UrlError> {
        let s = input.trim();
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) if sch.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
            Some((sch, rest)) if sch.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
            Some((sch, _)) => {
                return Err(refuse(format!(
                    "scheme {sch:?} is not supported; use https://HOST[:PORT]"
                )));
            }
            None => {
                return Err(refuse("it has no scheme; write it as https://HOST[:PORT]"));
            }
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if !(tail.is_empty() || tail == "/") {
            return Err(refuse(format!(
                "it has a path, query or fragment ({tail:?}); give only the server's \
                 scheme://HOST[:PORT] (the API lives at /api/v1 on it)"
            )));
        }
        if authority.contains('@') {
            return Err(refuse(
                "it holds user information (`user@`); the token goes to `airlock login`'s \
                 prompt or --token-stdin, never into the URL",
            ));
        }
        if authority.is_empty() {
            return Err(refuse("it has no host"));
        }
        let (host_text, bracketed, port_text) = split_host_port(authority)?;
        let host = if bracketed {
            let v6 = host_text
                .parse::<Ipv6Addr>()
                .map_err(|_| refuse(format!("[{host_text}] is not an IPv6 address")))?;
            Host::Ip(IpAddr::V6(v6))
        } else {
            parse_host(host_text)?
        };
        let port = match port_text {
            None => match scheme {
                Scheme::Https => 443,
                Scheme::Http => 80,
            },
            Some(p) => Some(p)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
                .ok_or_else(|| refuse(format!("port {p:?} is not a number from 1 to 65535")))?,
        };
        if scheme == Scheme::Http && !host.is_loopback() {
            let port = port_text.map(|p| format!(":{p}")).unwrap_or_default();
            return Err(refuse(format!(
                "plain http:// is allowed only to a loopback address (127.0.0.0/8, ::1 or \
                 localhost), not {host}: the token would cross the network in clear; use \
                 https://{host}{port}"
            )));
        }
        Ok(Self { scheme, host, port })
    }

    pub fn is_tls(&self) -> bool {
        self.scheme == Scheme::Https
    }

    /// The `Host` header value (the port is always written; it is always correct to).
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Splits `host[:port]` or `[v6]:port`; the bool says the host was in brackets.
fn split_host_port(authority: &str) -> Result<(&str, bool, Option<&str>), UrlError> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) =
            rest.split_once(']').ok_or_else(|| refuse("an IPv6 address has no closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                refuse(format!("unexpected {p:?} after the IPv6 address; write [ADDR]:PORT"))
            })?),
        };
        return Ok((inside, true, port));
    }
    match authority.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => {
            Err(refuse("an IPv6 address must be written in brackets: https://[ADDR]:PORT"))
        }
        Some((h, p)) => Ok((h, false, Some(p))),
        None => Ok((authority, false, None)),
    }
}

fn parse_host(text: &str) -> Result<Host, UrlError> {
    if text.is_empty() {
        return Err(refuse("it has no host"));
    }
    if let Ok(v4) = text.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(v4)));
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(refuse(format!("{text:?} is not a valid IPv4 address")));
    }
    let ascii = idna::domain_to_ascii(text)
        .map_err(|_| refuse(format!("{text:?} is not a valid host name")))?;
    let ascii = ascii.strip_suffix('.').unwrap_or(&ascii).to_owned();
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if ascii.is_empty() || ascii.len() > 253 || !ascii.split('.').all(ok_label) {
        return Err(refuse(format!("{text:?} is not a valid host name")));
    }
    Ok(Host::Name(ascii))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        ServerUrl::parse(s).unwrap().to_string()
    }

    fn err(s: &str) -> String {
        ServerUrl::parse(s).unwrap_err().reason
    }

    #[test]
    fn accepted_forms_are_normalized() {
        assert_eq!(norm("https://review.example.com"), "https://review.example.com:443");
        assert_eq!(norm("HTTPS://Review.Example.COM:8443/"), "https://review.example.com:8443");
        assert_eq!(norm("https://review.example.com."), "https://review.example.com:443");
        assert_eq!(norm("http://127.0.0.44:8443"), "http://127.0.0.44:8443");
        assert_eq!(norm("http://127.1.2.3"), "http://127.1.2.3:80");
        assert_eq!(norm("http://[::1]:9/"), "http://[::1]:9");
        assert_eq!(norm("http://localhost:8443"), "http://localhost:8443");
        assert_eq!(norm("https://[2001:db8::1]"), "https://[2001:db8::1]:443");
        assert_eq!(norm("https://10.0.0.1:1"), "https://10.0.0.1:1");
        assert_eq!(norm("https://bücher.example"), "https://xn--bcher-kva.example:443");
    }

    #[test]
    fn plain_http_to_a_non_loopback_host_is_refused() {
        for url in [
            "http://review.example.com",
            "http://10.0.0.1:8443",
            "http://192.168.1.2",
            "http://[2001:db8::1]:80",
            "http://[::ffff:127.0.0.1]",
            "http://localhost.example.com",
            "http://0.0.0.0",
        ] {
            let e = err(url);
            assert!(e.contains("only to a loopback address"), "{url}: {e}");
            assert!(e.contains("use https://"), "{url}: {e}");
        }
        assert!(err("http://10.0.0.1").ends_with("use https://10.0.0.1"));
        assert!(err("http://10.0.0.1:8443/").ends_with("use https://10.0.0.1:8443"));
    }

    #[test]
    fn paths_userinfo_queries_and_junk_are_refused() {
        assert!(err("https://h.example/api").contains("path"));
        assert!(err("https://h.example/?x=1").contains("query"));
        assert!(err("https://h.example#f").contains("fragment"));
        assert!(err("https://u:p@h.example").contains("user information"));
        assert!(err("https://tok@h.example").contains("user information"));
        assert!(err("h.example").contains("no scheme"));
        assert!(err("ftp://h.example").contains("not supported"));
        assert!(err("https://").contains("no host"));
        assert!(err("https://:443").contains("no host"));
        assert!(err("https://h.example:0").contains("port"));
        assert!(err("https://h.example:65536").contains("port"));
        assert!(err("https://h.example:+44").contains("port"));
        assert!(err("https://h.example:").contains("port"));
        assert!(err("https://::1").contains("brackets"));
        assert!(err("https://[::1").contains("closing"));
        assert!(err("https://[::1]x").contains("after the IPv6"));
        assert!(err("https://[h.example]").contains("not an IPv6"));
        assert!(err("https://h_x.example").contains("not a valid host name"));
        assert!(err("https://999.1.1.1").contains("not a valid IPv4"));
    }

    #[test]
    fn loopback_means_literals_and_localhost_only() {
        let host = |s: &str| ServerUrl::parse(s).unwrap().host;
        assert!(host("https://127.0.0.1").is_loopback());
        assert!(host("https://127.255.0.9").is_loopback());
        assert!(host("https://[::1]").is_loopback());
        assert!(host("https://localhost").is_loopback());
        assert!(!host("https://128.0.0.1").is_loopback());
        assert!(!host("https://[::2]").is_loopback());
        assert!(!host("https://localhost.example").is_loopback());
    }
}
