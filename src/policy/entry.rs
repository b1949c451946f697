//! `allow` / `block` entries (DESIGN §4): parsing, canonical form and single-entry matching.
//!
//! Grammar (one way to write each thing):
//!
//! ```text
//! entry    = name-pat [ ":" port ] | ipv4 [ "/" len ] [ ":" port ] | "[" ipv6 [ "/" len ] "]" [ ":" port ]
//! name-pat = name          ; the name and all its subdomains
//!          | "*." name     ; subdomains only
//!          | "=" name      ; that name only
//! port     = 1..65535 | "*"
//! ```
//!
//! Examples: `example.com`, `*.example.com:8443`, `=api.example.com`, `github.com:22`,
//! `10.0.0.0/8`, `10.1.2.3:8443`, `[::1]:8080`, `[2001:db8::/32]:443`. IPv6 is always
//! bracketed and the prefix length goes *inside* the brackets. Names are canonicalized like any
//! host (Unicode accepted). A CIDR with host bits set is an error, not silently truncated.
//! An **allow** entry without a port allows 80 and 443; a **block** entry without a port blocks
//! every port. An address entry whose IPv6 form embeds IPv4 (`[::ffff:10.1.2.3]`) stands for the
//! IPv4 address, as targets do, and so does a mapped/NAT64 range of /96 or longer
//! (`[::ffff:10.0.0.0/104]` is `10.0.0.0/8`); other IPv6 ranges never match an embedded-IPv4
//! target when allowing, but block ranges are checked against both forms.

use std::fmt;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::addr::{effective, normalize_net};
use super::canon::{Host, canonicalize_host};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    Allow,
    Block,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Block => "block",
        }
    }
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which names a name entry covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NameMatch {
    /// `=example.com`
    Exact,
    /// `example.com`: the name and all subdomains.
    Tree,
    /// `*.example.com`
    Subdomains,
}

/// The port part of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpec {
    /// No port written: allow entries cover 80 and 443, block entries every port.
    Default,
    /// `:*`
    Any,
    /// `:PORT`
    Port(u16),
}

/// What an entry matches, canonical.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    Name { name: String, how: NameMatch },
    Net(IpNet),
}

/// One parsed `allow` or `block` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    text: String,
    kind: EntryKind,
    pattern: Pattern,
    port: PortSpec,
}

/// An entry that cannot be used: says what is wrong and how to write it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} entry {entry:?}: {message}")]
pub struct EntryError {
    entry: String,
    kind: EntryKind,
    message: String,
}

impl EntryError {
    fn new(entry: &str, kind: EntryKind, message: impl Into<String>) -> Self {
        Self { entry: entry.to_owned(), kind, message: message.into() }
    }

    /// The entry as written.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// What is wrong, without the entry prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl Entry {
    pub fn parse(text: &str, kind: EntryKind) -> Result<Entry, EntryError> {
        let err = |m: String| EntryError::new(text, kind, m);
        if text.is_empty() {
            return Err(err("the entry is empty; write a host such as \"example.com\"".into()));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err("it contains whitespace; write one host per entry".into()));
        }
        if text.contains("://") {
            return Err(err(
                "write the host without a scheme, e.g. \"example.com\" or \"example.com:8443\""
                    .into(),
            ));
        }
        if text == "*" || text == "*:*" {
            return Err(err("`*` is not an entry; to permit everything that is not blocked, set \
                 mode = \"blocklist\""
                .into()));
        }

        // Bracketed IPv6 (optionally a CIDR), optionally with a port.
        if let Some(rest) = text.strip_prefix('[') {
            let Some((inner, after)) = rest.split_once(']') else {
                return Err(err("the `[` is never closed; write IPv6 as \"[2001:db8::1]\"".into()));
            };
            let port = match after {
                "" => PortSpec::Default,
                a if a.starts_with('/') => {
                    return Err(err(format!(
                        "put the prefix length inside the brackets: \"[{inner}{a}]\""
                    )));
                }
                a => match a.strip_prefix(':') {
                    Some(p) => parse_port(p).map_err(&err)?,
                    None => {
                        return Err(err("after `]` only `:PORT` or `:*` may follow".into()));
                    }
                },
            };
            let net = match inner.split_once('/') {
                Some((addr, len)) => {
                    let addr: std::net::Ipv6Addr = addr.parse().map_err(|_| {
                        err(format!("{addr:?} is not an IPv6 address; brackets are only for IPv6"))
                    })?;
                    let len = parse_prefix_len(len, 128).map_err(&err)?;
                    let net =
                        Ipv6Net::new(addr, len).map_err(|_| err("bad prefix length".into()))?;
                    if net.network() != addr {
                        return Err(err(format!(
                            "the range has host bits set; did you mean \"[{}]\"?",
                            net.trunc()
                        )));
                    }
                    IpNet::V6(net)
                }
                None => match canonicalize_host(&format!("[{inner}]")) {
                    Ok(Host::Ip(ip)) => IpNet::from(effective(ip)),
                    Ok(Host::Name(_)) => {
                        return Err(err("brackets are only for IPv6 addresses".into()));
                    }
                    Err(e) => return Err(err(e.to_string())),
                },
            };
            let pattern = Pattern::Net(normalize_net(net));
            return Ok(Entry { text: text.to_owned(), kind, pattern, port });
        }

        let (how, body) = if let Some(b) = text.strip_prefix('=') {
            (Some(NameMatch::Exact), b)
        } else if let Some(b) = text.strip_prefix("*.") {
            (Some(NameMatch::Subdomains), b)
        } else {
            (None, text)
        };
        let (host, port) = match body.matches(':').count() {
            0 => (body, PortSpec::Default),
            1 => match body.split_once(':') {
                Some((h, p)) => (h, parse_port(p).map_err(&err)?),
                None => (body, PortSpec::Default),
            },
            _ => {
                return Err(err("IPv6 addresses are written in brackets: \"[2001:db8::1]\", \
                     \"[2001:db8::1]:443\" or \"[2001:db8::/32]\""
                    .into()));
            }
        };
        if host.contains('*') {
            return Err(err(
                "a wildcard may only start the entry, as \"*.example.com\" (subdomains only)"
                    .into(),
            ));
        }
        if host.contains('[') || host.contains(']') {
            return Err(err("brackets are only for IPv6 addresses, as \"[2001:db8::1]\"".into()));
        }

        // IPv4 CIDR.
        if let Some((addr, len)) = host.split_once('/') {
            if how.is_some() {
                return Err(err("`=` and `*.` apply to names, not address ranges".into()));
            }
            let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| {
                err(format!(
                    "{addr:?} is not an IPv4 address; a range is written \"10.0.0.0/8\" or \
                     \"[2001:db8::/32]\""
                ))
            })?;
            let len = parse_prefix_len(len, 32).map_err(&err)?;
            let net = Ipv4Net::new(addr, len).map_err(|_| err("bad prefix length".into()))?;
            if net.network() != addr {
                return Err(err(format!(
                    "the range has host bits set; did you mean \"{}\"?",
                    net.trunc()
                )));
            }
            return Ok(Entry {
                text: text.to_owned(),
                kind,
                pattern: Pattern::Net(IpNet::V4(net)),
                port,
            });
        }

        let pattern = match canonicalize_host(host) {
            Ok(Host::Name(name)) => Pattern::Name { name, how: how.unwrap_or(NameMatch::Tree) },
            Ok(Host::Ip(ip)) => {
                if how.is_some() {
                    return Err(err("`=` and `*.` apply to names, not addresses".into()));
                }
                Pattern::Net(IpNet::from(effective(ip)))
            }
            Err(e) => return Err(err(e.to_string())),
        };
        Ok(Entry { text: text.to_owned(), kind, pattern, port })
    }

    /// The entry as written in its file.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    pub fn pattern(&self) -> &Pattern {
        &self.pattern
    }

    pub fn port_spec(&self) -> PortSpec {
        self.port
    }

    /// Whether the entry names its port explicitly (`:PORT` or `:*`).
    pub fn names_port(&self) -> bool {
        self.port != PortSpec::Default
    }

    /// The canonical spelling (`=bücher.example` → `=xn--bcher-kva.example`): equal entries
    /// have equal canonical forms.
    pub fn canonical(&self) -> String {
        let host = match &self.pattern {
            Pattern::Name { name, how: NameMatch::Exact } => format!("={name}"),
            Pattern::Name { name, how: NameMatch::Tree } => name.clone(),
            Pattern::Name { name, how: NameMatch::Subdomains } => format!("*.{name}"),
            Pattern::Net(IpNet::V4(n)) if n.prefix_len() == 32 => n.addr().to_string(),
            Pattern::Net(IpNet::V4(n)) => n.to_string(),
            Pattern::Net(IpNet::V6(n)) if n.prefix_len() == 128 => format!("[{}]", n.addr()),
            Pattern::Net(IpNet::V6(n)) => format!("[{n}]"),
        };
        match self.port {
            PortSpec::Default => host,
            PortSpec::Any => format!("{host}:*"),
            PortSpec::Port(p) => format!("{host}:{p}"),
        }
    }

    /// Whether the entry's port part covers `port`.
    pub fn port_matches(&self, port: u16) -> bool {
        port_covers(self.port, self.kind, port)
    }

    /// Whether a name pattern covers the canonical name `name` (ports aside).
    pub fn name_matches(&self, name: &str) -> bool {
        match &self.pattern {
            Pattern::Name { name: pat, how } => name_covers(pat, *how, name),
            Pattern::Net(_) => false,
        }
    }

    /// Whether this entry alone covers `(host, port)`: names by name, addresses by their
    /// effective address (the reference semantics the index must agree with).
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        if !self.port_matches(port) {
            return false;
        }
        match (&self.pattern, host) {
            (Pattern::Name { .. }, Host::Name(n)) => self.name_matches(n),
            (Pattern::Net(net), Host::Ip(ip)) => {
                net.contains(&effective(*ip)) || (self.kind == EntryKind::Block && net.contains(ip))
            }
            _ => false,
        }
    }
}

/// The entry as written.
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

pub(crate) fn port_covers(spec: PortSpec, kind: EntryKind, port: u16) -> bool {
    match spec {
        PortSpec::Any => true,
        PortSpec::Port(p) => p == port,
        PortSpec::Default => match kind {
            EntryKind::Allow => port == 80 || port == 443,
            EntryKind::Block => true,
        },
    }
}

/// `name` is `pat` or a subdomain of it, per `how`.
pub(crate) fn name_covers(pat: &str, how: NameMatch, name: &str) -> bool {
    let equal = name == pat;
    let below = name.len() > pat.len() + 1
        && name.ends_with(pat)
        && name.as_bytes()[name.len() - pat.len() - 1] == b'.';
    match how {
        NameMatch::Exact => equal,
        NameMatch::Tree => equal || below,
        NameMatch::Subdomains => below,
    }
}

fn parse_port(p: &str) -> Result<PortSpec, String> {
    if p == "*" {
        return Ok(PortSpec::Any);
    }
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the port {p:?} is not a number from 1 to 65535 or `*`"));
    }
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n)
            .map(PortSpec::Port)
            .map_err(|_| format!("the port {p:?} is out of range")),
        _ => Err(format!("the port {p} is out of range; ports run from 1 to 65535 (or `*`)")),
    }
}

fn parse_prefix_len(len: &str, max: u8) -> Result<u8, String> {
    match len.parse::<u8>() {
        Ok(n) if n <= max && !len.starts_with('+') => Ok(n),
        _ => Err(format!("the prefix length {len:?} must be a number from 0 to {max}")),
    }
}

impl From<IpAddr> for Pattern {
    fn from(ip: IpAddr) -> Self {
        Pattern::Net(IpNet::from(effective(ip)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn allow(s: &str) -> Entry {
        Entry::parse(s, EntryKind::Allow).unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    fn block(s: &str) -> Entry {
        Entry::parse(s, EntryKind::Block).unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    fn host(s: &str) -> Host {
        canonicalize_host(s).unwrap()
    }

    #[test]
    fn entries_parse_to_canonical_forms() {
        let cases = [
            ("example.com", "example.com"),
            ("Example.COM.", "example.com"),
            ("*.example.com", "*.example.com"),
            ("=example.com", "=example.com"),
            ("=BÜCHER.example:8443", "=xn--bcher-kva.example:8443"),
            ("github.com:22", "github.com:22"),
            ("github.com:*", "github.com:*"),
            ("*.example.com:0443", "*.example.com:443"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3", "10.1.2.3"),
            ("10.1.2.3/32", "10.1.2.3"),
            ("10.1.2.3:8443", "10.1.2.3:8443"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("10.0.0.0/8:*", "10.0.0.0/8:*"),
            ("[::1]", "[::1]"),
            ("[::1]:8080", "[::1]:8080"),
            ("[2001:db8::/32]", "[2001:db8::/32]"),
            ("[2001:DB8::/32]:443", "[2001:db8::/32]:443"),
            ("[::ffff:10.1.2.3]", "10.1.2.3"),
            ("[::ffff:10.1.2.3]:22", "10.1.2.3:22"),
            ("[::ffff:10.0.0.0/104]", "10.0.0.0/8"),
            ("[64:ff9b::a00:0/104]:443", "10.0.0.0/8:443"),
        ];
        for (text, canonical) in cases {
            let e = allow(text);
            assert_eq!(e.canonical(), canonical, "{text}");
            assert_eq!(e.text(), text);
        }
        assert!(!allow("example.com").names_port());
        assert!(allow("example.com:443").names_port());
        assert!(allow("example.com:*").names_port());
        assert!(allow("[::1]:22").names_port());
    }

    #[test]
    fn bad_entries_say_how_to_write_them() {
        let cases = [
            ("", "empty"),
            ("example.com:0", "out of range"),
            ("example.com:65536", "out of range"),
            ("example.com:", "not a number"),
            ("example.com:http", "not a number"),
            ("10.1.0.0/8", "did you mean \"10.0.0.0/8\""),
            ("[2001:db8::1/32]", "did you mean \"[2001:db8::/32]\""),
            ("10.0.0.0/33", "prefix length"),
            ("[::/129]", "prefix length"),
            ("[2001:db8::]/32", "inside the brackets: \"[2001:db8::/32]\""),
            ("2001:db8::1", "in brackets"),
            ("::1", "in brackets"),
            ("*", "blocklist"),
            ("*.*.example.com", "wildcard"),
            ("foo.*.com", "wildcard"),
            ("https://example.com", "without a scheme"),
            ("=10.0.0.1", "names, not addresses"),
            ("*.10.0.0.0/8", "names, not address ranges"),
            ("[example.com]", "IPv6"),
            ("[::1", "never closed"),
            ("[::1]x", "only `:PORT`"),
            ("2130706433", "dotted quad (127.0.0.1)"),
            ("a..b", "empty label"),
            ("exa mple.com", "whitespace"),
            ("user@example.com", "userinfo"),
            ("10.0.0.256/8", "not an IPv4 address"),
        ];
        for (text, needle) in cases {
            let err = Entry::parse(text, EntryKind::Allow).expect_err(text);
            let msg = err.to_string();
            assert!(msg.contains(needle), "{text:?}: {msg}");
            assert!(msg.starts_with(&format!("invalid allow entry {text:?}: ")), "{msg}");
            assert_eq!(err.entry(), text);
        }
    }

    #[test]
    fn name_matching_table() {
        // (entry, target, port, allow matches, block matches)
        let cases: &[(&str, &str, u16, bool, bool)] = &[
            ("example.com", "example.com", 443, true, true),
            ("example.com", "example.com", 80, true, true),
            ("example.com", "example.com", 22, false, true), // block without port: every port
            ("example.com", "api.example.com", 443, true, true),
            ("example.com", "a.b.example.com", 443, true, true),
            ("example.com", "badexample.com", 443, false, false),
            ("example.com", "example.com.evil", 443, false, false),
            ("example.com", "com", 443, false, false),
            ("*.example.com", "example.com", 443, false, false),
            ("*.example.com", "api.example.com", 443, true, true),
            ("*.example.com", "a.b.example.com", 443, true, true),
            ("*.example.com", "xexample.com", 443, false, false),
            ("=example.com", "example.com", 443, true, true),
            ("=example.com", "api.example.com", 443, false, false),
            ("example.com:8443", "example.com", 8443, true, true),
            ("example.com:8443", "example.com", 443, false, false),
            ("example.com:*", "example.com", 1, true, true),
            ("example.com:*", "example.com", 65535, true, true),
            ("=example.com:22", "example.com", 22, true, true),
            ("=example.com:22", "example.com", 23, false, false),
            ("*.example.com:22", "git.example.com", 22, true, true),
            ("*.example.com:22", "git.example.com", 443, false, false),
            ("bücher.example", "xn--bcher-kva.example", 443, true, true),
            ("bücher.example", "www.xn--bcher-kva.example", 443, true, true),
            ("xn--bcher-kva.example", "bücher.example", 443, true, true),
            ("example.com", "10.0.0.1", 443, false, false),
            ("10.0.0.0/8", "10.1.2.3", 443, true, true),
            ("10.0.0.0/8", "10.1.2.3", 22, false, true),
            ("10.0.0.0/8", "11.0.0.0", 443, false, false),
            ("10.0.0.0/8", "9.255.255.255", 443, false, false),
            ("10.0.0.0/8", "[::ffff:10.1.2.3]", 443, true, true),
            ("10.0.0.0/8", "[64:ff9b::10.1.2.3]", 443, true, true),
            ("10.0.0.0/8", "[2002:a01:203::]", 443, true, true),
            ("10.0.0.0/8", "example.com", 443, false, false),
            ("10.1.2.3:8443", "10.1.2.3", 8443, true, true),
            ("10.1.2.3:8443", "10.1.2.3", 443, false, false),
            ("[::1]:8080", "::1", 8080, true, true),
            ("[::1]:8080", "::2", 8080, false, false),
            ("[2001:db8::/32]:443", "2001:db8:1::5", 443, true, true),
            ("[2001:db8::/32]:443", "2001:db9::5", 443, false, false),
            ("[::ffff:10.1.2.3]", "10.1.2.3", 443, true, true),
            // An IPv6 range is not an IPv4 range: an embedded address is decided as IPv4
            // when allowing, but block ranges catch the IPv6 form too.
            ("[2002::/16]", "2002:a01:203::", 443, false, true),
            ("[::fffe:0:0/95]", "::ffff:10.1.2.3", 443, false, true),
            ("[::ffff:10.0.0.0/104]", "10.9.9.9", 443, true, true),
            ("[::ffff:10.0.0.0/104]", "::ffff:10.9.9.9", 443, true, true),
        ];
        for &(entry, target, port, want_allow, want_block) in cases {
            let h = host(target);
            assert_eq!(
                allow(entry).matches(&h, port),
                want_allow,
                "allow {entry} ~ {target}:{port}"
            );
            assert_eq!(
                block(entry).matches(&h, port),
                want_block,
                "block {entry} ~ {target}:{port}"
            );
        }
    }
}
