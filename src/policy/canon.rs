//! Host canonicalization and target parsing: the first thing that happens to any host a user
//! writes or an agent asks for (DESIGN §4, SECURITY §3). Every later comparison is a byte
//! comparison between canonical forms, so anything ambiguous is refused here.
//!
//! A canonical host is either an IP address or a name that is lowercase ASCII (Unicode labels
//! converted to A-labels by UTS-46, non-transitional, CheckHyphens, CheckBidi, CheckJoiners),
//! LDH labels of 1..=63 bytes, at most 253 bytes, with no trailing dot.
//!
//! Refused as malformed (never "guessed"): empty input, two trailing dots, empty labels,
//! numeric IPv4 encodings that `inet_aton(3)` or a URL parser would read as an address
//! (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`, and any name whose last label is all digits
//! or `0x…`, per the WHATWG URL "ends in a number" rule), userinfo (`user@host`),
//! percent-escapes, IPv6 zone ids (`fe80::1%eth0`), brackets around anything but an IPv6
//! address, whitespace and control characters.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

/// Longest name (RFC 1035 §2.3.4: 255 octets on the wire = 253 characters written out).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;
/// Inputs longer than this are refused before any Unicode processing (bounds the work an
/// agent can cause per request; UTS-46 mapping can only shrink ignored code points).
const MAX_INPUT_LEN: usize = 1024;

/// A canonical host.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// Lowercase ASCII (A-labels), no trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// `host:port` as it goes on the wire; IPv6 in brackets (`[::1]:443`, RFC 3986 §3.2.2).
    pub fn authority(&self, port: u16) -> String {
        match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }

    pub fn as_name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }

    pub fn as_ip(&self) -> Option<IpAddr> {
        match self {
            Host::Ip(ip) => Some(*ip),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A parsed CLI target (`airlock policy check TARGET`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    /// `None` when the input named no port (a URL always names one: 80 or 443 by default).
    pub port: Option<u16>,
}

/// What is wrong with a malformed host or target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MalformedKind {
    Empty,
    TooLong,
    LabelTooLong,
    EmptyLabel,
    TrailingDots,
    NumericIpv4,
    Userinfo,
    PercentEscape,
    ZoneId,
    BracketedNonIpv6,
    InvalidIpv6,
    Whitespace,
    InvalidCharacter,
    Hyphen,
    Idna,
    Port,
    Scheme,
    Path,
}

/// A host or target that cannot be used. `Display` says what is wrong and how to write it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Malformed {
    kind: MalformedKind,
    message: String,
}

impl Malformed {
    fn new(kind: MalformedKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    pub fn kind(&self) -> MalformedKind {
        self.kind
    }
}

/// Quote user input for a message without letting control characters through.
fn q(s: &str) -> String {
    format!("{:?}", s)
}

/// Canonicalize a bare host: a name, a dotted-quad IPv4 address, a bare or bracketed IPv6
/// address. No port, scheme or path.
pub fn canonicalize_host(input: &str) -> Result<Host, Malformed> {
    use MalformedKind as K;
    if input.is_empty() {
        return Err(Malformed::new(
            K::Empty,
            "the host is empty; write a name such as example.com",
        ));
    }
    if input.len() > MAX_INPUT_LEN {
        return Err(Malformed::new(
            K::TooLong,
            format!("the host is {} bytes long; a host name has at most 253", input.len()),
        ));
    }
    if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Malformed::new(
            K::Whitespace,
            format!("{} contains whitespace or a control character; a host has neither", q(input)),
        ));
    }
    if input.contains('@') {
        return Err(Malformed::new(
            K::Userinfo,
            format!("{} contains userinfo (`user@`); write only the host", q(input)),
        ));
    }
    if let Some(rest) = input.strip_prefix('[') {
        let Some(inner) = rest.strip_suffix(']') else {
            return Err(Malformed::new(
                K::InvalidCharacter,
                format!("{} has an unclosed bracket; write IPv6 as [2001:db8::1]", q(input)),
            ));
        };
        return parse_v6(inner, input, true).map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    if input.contains(['[', ']']) {
        return Err(Malformed::new(
            K::InvalidCharacter,
            format!("{} has a stray bracket; brackets only enclose an IPv6 address", q(input)),
        ));
    }
    if input.contains(':') {
        return parse_v6(input, input, false).map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    if input.contains('%') {
        return Err(Malformed::new(
            K::PercentEscape,
            format!("{} contains a percent-escape; write the host name plainly", q(input)),
        ));
    }
    if input.contains(['/', '\\', '?', '#']) {
        return Err(Malformed::new(
            K::Path,
            format!("{} contains a path or query character; write only the host", q(input)),
        ));
    }

    let (body, stripped) = match input.strip_suffix('.') {
        Some(b) => (b, true),
        None => (input, false),
    };
    if body.is_empty() {
        return Err(Malformed::new(
            K::Empty,
            "the host is just a dot; write a name such as example.com",
        ));
    }
    if body.ends_with('.') {
        return Err(Malformed::new(
            K::TrailingDots,
            format!("{} ends in more than one dot; at most one trailing dot is allowed", q(input)),
        ));
    }
    // Rust's parser accepts exactly four decimal octets without leading zeros; every other
    // numeric spelling falls through to the numeric-label check below and is refused.
    if let Ok(v4) = body.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(v4)));
    }

    if body.is_ascii() {
        let lower = body.to_ascii_lowercase();
        check_ascii_name(&lower, input)?;
        // Plain LDH labels without `xn--` are already canonical: UTS-46 would pass them
        // through unchanged, so skip it (the common case on the proxy's hot path).
        if !lower.split('.').any(|l| l.starts_with("xn--")) {
            return Ok(Host::Name(lower));
        }
    }

    let ascii = Uts46::new()
        .to_ascii(body.as_bytes(), AsciiDenyList::STD3, Hyphens::Check, DnsLength::Ignore)
        .map_err(|_| {
            Malformed::new(
                K::Idna,
                format!(
                    "{} is not a valid internationalized name (UTS-46: a disallowed character, \
                     a misplaced hyphen, invalid punycode, or a bidi/joiner rule violation)",
                    q(input)
                ),
            )
        })?;
    let mut name = ascii.into_owned();
    // A Unicode full stop (U+3002 etc.) maps to '.', so a trailing one appears only now.
    if name.ends_with('.') {
        if stripped {
            return Err(Malformed::new(
                K::TrailingDots,
                format!(
                    "{} ends in more than one dot; at most one trailing dot is allowed",
                    q(input)
                ),
            ));
        }
        name.pop();
    }
    check_ascii_name(&name, input)?;
    Ok(Host::Name(name))
}

fn parse_v6(text: &str, input: &str, bracketed: bool) -> Result<Ipv6Addr, Malformed> {
    use MalformedKind as K;
    if let Some((addr, _zone)) = text.split_once('%') {
        let hint =
            if addr.parse::<Ipv6Addr>().is_ok() { format!(" ({addr})") } else { String::new() };
        return Err(Malformed::new(
            K::ZoneId,
            format!(
                "{} carries an IPv6 zone id (`%…`); zone ids are host-local and not allowed, \
                 write the address alone{hint}",
                q(input)
            ),
        ));
    }
    text.parse::<Ipv6Addr>().map_err(|_| {
        if bracketed {
            Malformed::new(
                K::BracketedNonIpv6,
                format!(
                    "{} is bracketed but is not an IPv6 address; brackets are only for IPv6",
                    q(input)
                ),
            )
        } else {
            Malformed::new(
                K::InvalidIpv6,
                format!(
                    "{} is neither a host name nor an IPv6 address (a `:` here means IPv6; \
                     write a port separately, as host:port)",
                    q(input)
                ),
            )
        }
    })
}

/// Check an ASCII lowercase name without trailing dot: labels, lengths, LDH, hyphens, and the
/// numeric last label.
fn check_ascii_name(name: &str, input: &str) -> Result<(), Malformed> {
    use MalformedKind as K;
    if name.is_empty() {
        return Err(Malformed::new(
            K::Empty,
            "the host is empty; write a name such as example.com",
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(Malformed::new(
                K::EmptyLabel,
                format!("{} has an empty label (`..` or a leading dot)", q(input)),
            ));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(Malformed::new(
                K::LabelTooLong,
                format!(
                    "{} has a label of {} characters; a label has at most {MAX_LABEL_LEN}",
                    q(input),
                    label.len()
                ),
            ));
        }
        if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return Err(Malformed::new(
                K::InvalidCharacter,
                format!(
                    "{} contains {:?}; host names use letters, digits and hyphens only",
                    q(input),
                    c
                ),
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(Malformed::new(
                K::Hyphen,
                format!("{} has a label that starts or ends with a hyphen ({label:?})", q(input)),
            ));
        }
        if label.get(2..4) == Some("--") && !label.starts_with("xn--") {
            return Err(Malformed::new(
                K::Hyphen,
                format!(
                    "{} has hyphens in the 3rd and 4th position of {label:?}; those are reserved \
                     for encodings such as xn-- (RFC 5891 §4.2.3.1)",
                    q(input)
                ),
            ));
        }
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Malformed::new(
            K::TooLong,
            format!(
                "the host is {} characters long; a host name has at most {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    if is_numeric_label(last) {
        let message = match inet_aton(name) {
            Some(v4) => format!(
                "{} is a numeric IPv4 encoding; write the address as a dotted quad ({v4})",
                q(input)
            ),
            None => format!(
                "{} ends in an all-numeric label, which resolvers and URL parsers read as an \
                 IPv4 address; a host name's last label must contain a letter, and an address \
                 is written as a dotted quad (127.0.0.1)",
                q(input)
            ),
        };
        return Err(Malformed::new(K::NumericIpv4, message));
    }
    Ok(())
}

/// The WHATWG URL "ends in a number" test for one label: all decimal digits, or `0x` followed by
/// hex digits (possibly none).
fn is_numeric_label(label: &str) -> bool {
    if let Some(hex) = label.strip_prefix("0x") {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit())
}

/// What `inet_aton(3)` would make of `s` (1–4 parts, each decimal, octal `0…` or hex `0x…`; the
/// last part fills the remaining bytes). Used only to tell the user which address they wrote.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let n = if let Some(h) = p.strip_prefix("0x") {
            if h.is_empty() { 0 } else { u64::from_str_radix(h, 16).ok()? }
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()?
        } else {
            p.parse::<u64>().ok()?
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    let mut value: u64 = 0;
    for (i, n) in head.iter().enumerate() {
        if *n > 255 {
            return None;
        }
        value |= n << (24 - 8 * i);
    }
    let rest_bits = 32 - 8 * head.len();
    if *last >= (1u64 << rest_bits) {
        return None;
    }
    value |= last;
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

fn parse_port(text: &str, input: &str) -> Result<u16, Malformed> {
    let bad = || {
        Malformed::new(
            MalformedKind::Port,
            format!("{}: the port {} is not a number from 1 to 65535", q(input), q(text)),
        )
    };
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(p) => Ok(p),
    }
}

/// Split `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
fn split_host_port<'a>(
    text: &'a str,
    input: &str,
) -> Result<(&'a str, Option<&'a str>), Malformed> {
    if text.starts_with('[') {
        let Some(close) = text.find(']') else {
            return Err(Malformed::new(
                MalformedKind::InvalidCharacter,
                format!("{} has an unclosed bracket; write IPv6 as [2001:db8::1]:443", q(input)),
            ));
        };
        let (host, rest) = text.split_at(close + 1);
        if rest.is_empty() {
            return Ok((host, None));
        }
        return match rest.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None => Err(Malformed::new(
                MalformedKind::InvalidCharacter,
                format!("{}: after `]` only `:port` may follow", q(input)),
            )),
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => text.split_once(':').map(|(h, p)| (h, Some(p))).ok_or_else(|| {
            // Unreachable: exactly one ':' was counted.
            Malformed::new(MalformedKind::Port, format!("{}: bad port", q(input)))
        }),
        _ => Ok((text, None)),
    }
}

/// Parse a CLI target: `host`, `host:port`, `[v6]`, `[v6]:port`, a bare IPv6 address, or an
/// `http://` / `https://` URL (port 80 / 443 unless given; path, query and fragment ignored).
pub fn parse_target(input: &str) -> Result<Target, Malformed> {
    if input.is_empty() {
        return Err(Malformed::new(
            MalformedKind::Empty,
            "the target is empty; write a host such as example.com",
        ));
    }
    if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Malformed::new(
            MalformedKind::Whitespace,
            format!("{} contains whitespace or a control character", q(input)),
        ));
    }
    if let Some((scheme, rest)) = input.split_once("://") {
        let default_port = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => {
                return Err(Malformed::new(
                    MalformedKind::Scheme,
                    format!(
                        "{}: only http:// and https:// URLs are understood; for other protocols write host:port",
                        q(input)
                    ),
                ));
            }
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains('@') {
            return Err(Malformed::new(
                MalformedKind::Userinfo,
                format!("{} contains userinfo (`user@`); write the URL without it", q(input)),
            ));
        }
        let (host, port) = split_host_port(authority, input)?;
        let host = canonicalize_host(host)?;
        let port = match port {
            Some(p) => parse_port(p, input)?,
            None => default_port,
        };
        return Ok(Target { host, port: Some(port) });
    }
    if input.contains(['/', '?', '#']) {
        return Err(Malformed::new(
            MalformedKind::Path,
            format!(
                "{} has a path but no scheme; write host, host:port or a URL (https://host/path)",
                q(input)
            ),
        ));
    }
    let (host, port) = split_host_port(input, input)?;
    let host = canonicalize_host(host)?;
    let port = port.map(|p| parse_port(p, input)).transpose()?;
    Ok(Target { host, port })
}

/// Parse a CONNECT request-target (RFC 9110 §9.3.6: `authority-form`): exactly `host:port` or
/// `[v6]:port`, port 1..=65535 required; no scheme, userinfo, path or whitespace.
pub fn parse_authority(input: &str) -> Result<(Host, u16), Malformed> {
    if input.is_empty() {
        return Err(Malformed::new(
            MalformedKind::Empty,
            "the CONNECT target is empty; expected host:port",
        ));
    }
    if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Malformed::new(
            MalformedKind::Whitespace,
            format!("{} contains whitespace or a control character", q(input)),
        ));
    }
    if input.contains('@') {
        return Err(Malformed::new(
            MalformedKind::Userinfo,
            format!("{} contains userinfo (`user@`); expected host:port", q(input)),
        ));
    }
    if input.contains(['/', '?', '#']) {
        return Err(Malformed::new(
            MalformedKind::Path,
            format!("{} is not an authority; expected host:port with no scheme or path", q(input)),
        ));
    }
    let (host, port) = if input.starts_with('[') {
        match split_host_port(input, input)? {
            (h, Some(p)) => (h, p),
            (_, None) => return Err(missing_port(input)),
        }
    } else {
        match input.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(Malformed::new(
                    MalformedKind::InvalidIpv6,
                    format!(
                        "{}: an IPv6 address in an authority must be bracketed, as [2001:db8::1]:443",
                        q(input)
                    ),
                ));
            }
            Some((h, p)) => (h, p),
            None => return Err(missing_port(input)),
        }
    };
    let port = parse_port(port, input)?;
    Ok((canonicalize_host(host)?, port))
}

fn missing_port(input: &str) -> Malformed {
    Malformed::new(MalformedKind::Port, format!("{} names no port; expected host:port", q(input)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::MalformedKind as K;
    use super::*;

    fn ok(input: &str) -> String {
        match canonicalize_host(input) {
            Ok(h) => h.to_string(),
            Err(e) => panic!("{input:?} should canonicalize, got: {e}"),
        }
    }

    fn bad(input: &str) -> (MalformedKind, String) {
        match canonicalize_host(input) {
            Ok(h) => panic!("{input:?} should be malformed, got {h:?}"),
            Err(e) => (e.kind(), e.to_string()),
        }
    }

    #[test]
    fn canonical_names_table() {
        let long_label = "a".repeat(63);
        let name_253 = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "a".repeat(61));
        assert_eq!(name_253.len(), 253);
        let cases: &[(&str, &str)] = &[
            ("example.com", "example.com"),
            ("EXAMPLE.COM", "example.com"),
            ("Example.Com.", "example.com"),
            ("a", "a"),
            ("localhost", "localhost"),
            ("a-b.example", "a-b.example"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example"),
            ("BÜCHER.example", "xn--bcher-kva.example"),
            ("bücher.example", "xn--bcher-kva.example"),
            ("bücher.example.", "xn--bcher-kva.example"),
            ("ÉCOLE.fr", "xn--cole-9oa.fr"),
            ("faß.de", "xn--fa-hia.de"), // non-transitional: ß is kept, not mapped to "ss"
            ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
            ("example。com", "example.com"), // U+3002 ideographic full stop is a dot
            ("ｅｘａｍｐｌｅ.com", "example.com"), // full-width letters map to ASCII
            ("مثال.إختبار", "xn--mgbh0fb.xn--kgbechtv"),
            ("1.example.com", "1.example.com"),
            ("123abc.com", "123abc.com"),
            ("a1.b2", "a1.b2"),
            ("0x7f.example", "0x7f.example"),
            ("com0x1", "com0x1"),
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1.", "127.0.0.1"),
            ("0.0.0.0", "0.0.0.0"),
            ("255.255.255.255", "255.255.255.255"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("[2001:DB8::1]", "2001:db8::1"),
            ("[::ffff:10.1.2.3]", "::ffff:10.1.2.3"),
            ("[::ffff:a01:203]", "::ffff:10.1.2.3"),
            ("2001:db8:0:0:0:0:0:1", "2001:db8::1"),
        ];
        for (input, want) in cases {
            assert_eq!(&ok(input), want, "input {input:?}");
        }
        assert_eq!(ok(&format!("{long_label}.com")), format!("{long_label}.com"));
        assert_eq!(ok(&name_253), name_253);
        assert_eq!(ok(&format!("{name_253}.")), name_253);
    }

    #[test]
    fn malformed_hosts_table() {
        let long_label = "a".repeat(64);
        let name_254 = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "a".repeat(62));
        let cases: Vec<(String, K)> = vec![
            ("".into(), K::Empty),
            (".".into(), K::Empty),
            ("example.com..".into(), K::TrailingDots),
            ("a..b".into(), K::EmptyLabel),
            (".example.com".into(), K::EmptyLabel),
            ("-a.com".into(), K::Hyphen),
            ("a-.com".into(), K::Hyphen),
            ("ab--cd.com".into(), K::Hyphen),
            (format!("{long_label}.com"), K::LabelTooLong),
            (name_254, K::TooLong),
            ("a".repeat(2000), K::TooLong),
            ("2130706433".into(), K::NumericIpv4),
            ("0177.0.0.1".into(), K::NumericIpv4),
            ("0x7f.1".into(), K::NumericIpv4),
            ("0x7f000001".into(), K::NumericIpv4),
            ("0X7F.1".into(), K::NumericIpv4),
            ("127.1".into(), K::NumericIpv4),
            ("127.0.1".into(), K::NumericIpv4),
            ("127.0.0.01".into(), K::NumericIpv4),
            ("1.2.3.256".into(), K::NumericIpv4),
            ("1.2.3.4.5".into(), K::NumericIpv4),
            ("example.123".into(), K::NumericIpv4),
            ("example.0x".into(), K::NumericIpv4),
            ("１２７.０.０.１".into(), K::NumericIpv4), // full-width digits map to ASCII
            ("user@example.com".into(), K::Userinfo),
            ("@example.com".into(), K::Userinfo),
            ("host%2ecom".into(), K::PercentEscape),
            ("example%2Ecom".into(), K::PercentEscape),
            ("fe80::1%eth0".into(), K::ZoneId),
            ("[fe80::1%eth0]".into(), K::ZoneId),
            ("[fe80::1%25eth0]".into(), K::ZoneId),
            ("[example.com]".into(), K::BracketedNonIpv6),
            ("[127.0.0.1]".into(), K::BracketedNonIpv6),
            ("[::1".into(), K::InvalidCharacter),
            ("::1]".into(), K::InvalidCharacter),
            ("example.com:443".into(), K::InvalidIpv6),
            ("exa mple.com".into(), K::Whitespace),
            (" example.com".into(), K::Whitespace),
            ("example.com\n".into(), K::Whitespace),
            ("exa\u{0}mple.com".into(), K::Whitespace),
            ("exa\tmple.com".into(), K::Whitespace),
            ("under_score.com".into(), K::InvalidCharacter),
            ("*.example.com".into(), K::InvalidCharacter),
            ("example.com/path".into(), K::Path),
            ("xn--invalid-punycode-.com".into(), K::Hyphen),
            ("xn--a.com".into(), K::Idna),
            ("a\u{200d}b.com".into(), K::Idna), // ZWJ outside a joining context (CheckJoiners)
            ("\u{05d0}1a.com".into(), K::Idna), // RTL label mixing in L: bidi rule violated
            ("a.\u{05d0}b1a.com".into(), K::Idna),
            ("\u{0301}a.com".into(), K::Idna), // leading combining mark
            ("ab\u{2028}cd.com".into(), K::Whitespace),
        ];
        for (input, want) in &cases {
            let (kind, msg) = bad(input);
            assert_eq!(kind, *want, "input {input:?}: {msg}");
            assert!(!msg.is_empty());
        }
    }

    #[test]
    fn numeric_ipv4_messages_name_the_dotted_quad() {
        let cases = [
            ("2130706433", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("10.0x10203", "10.1.2.3"),
        ];
        for (input, quad) in cases {
            let (_, msg) = bad(input);
            assert_eq!(
                msg,
                format!(
                    "\"{input}\" is a numeric IPv4 encoding; write the address as a dotted quad \
                     ({quad})"
                )
            );
        }
        let (_, msg) = bad("example.123");
        assert!(msg.contains("all-numeric label"), "{msg}");
    }

    #[test]
    fn authority_brackets_v6() {
        assert_eq!(canonicalize_host("::1").unwrap().authority(443), "[::1]:443");
        assert_eq!(canonicalize_host("10.0.0.1").unwrap().authority(80), "10.0.0.1:80");
        assert_eq!(canonicalize_host("Example.com").unwrap().authority(22), "example.com:22");
    }

    #[test]
    fn targets() {
        let t = |s: &str| parse_target(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let name = |s: &str| Host::Name(s.into());
        assert_eq!(t("example.com"), Target { host: name("example.com"), port: None });
        assert_eq!(t("Example.com:8443"), Target { host: name("example.com"), port: Some(8443) });
        assert_eq!(t("[::1]").host, canonicalize_host("::1").unwrap());
        assert_eq!(t("[::1]:22").port, Some(22));
        assert_eq!(t("2001:db8::1").port, None);
        assert_eq!(t("https://api.example.com/v1?x=1").port, Some(443));
        assert_eq!(t("HTTP://example.com").port, Some(80));
        assert_eq!(t("http://example.com:8080/x").port, Some(8080));
        assert_eq!(t("https://[::1]:8443/").port, Some(8443));
        assert_eq!(t("https://bücher.example/").host, name("xn--bcher-kva.example"));
        assert_eq!(t("https://example.com#frag").host, name("example.com"));

        let bad = |s: &str| parse_target(s).err().unwrap_or_else(|| panic!("{s} parsed")).kind();
        assert_eq!(bad(""), K::Empty);
        assert_eq!(bad("example.com:0"), K::Port);
        assert_eq!(bad("example.com:65536"), K::Port);
        assert_eq!(bad("example.com:"), K::Port);
        assert_eq!(bad("example.com:+80"), K::Port);
        assert_eq!(bad("example.com:http"), K::Port);
        assert_eq!(bad("ftp://example.com"), K::Scheme);
        assert_eq!(bad("https://user:pw@example.com/"), K::Userinfo);
        assert_eq!(bad("user@example.com"), K::Userinfo);
        assert_eq!(bad("example.com/path"), K::Path);
        assert_eq!(bad("2130706433"), K::NumericIpv4);
        assert_eq!(bad("https://2130706433/"), K::NumericIpv4);
        assert_eq!(bad("[::1]x"), K::InvalidCharacter);
        assert_eq!(bad("fe80::1%eth0"), K::ZoneId);
        assert_eq!(bad("example.com :80"), K::Whitespace);
    }

    #[test]
    fn authorities() {
        let a = |s: &str| parse_authority(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(a("example.com:443"), (Host::Name("example.com".into()), 443));
        assert_eq!(a("EXAMPLE.com.:22"), (Host::Name("example.com".into()), 22));
        assert_eq!(a("[::1]:8080").1, 8080);
        assert_eq!(a("[::ffff:127.0.0.1]:443").0.to_string(), "::ffff:127.0.0.1");
        assert_eq!(a("127.0.0.1:1").1, 1);
        assert_eq!(a("h:65535").1, 65535);

        let bad = |s: &str| parse_authority(s).err().unwrap_or_else(|| panic!("{s} parsed")).kind();
        assert_eq!(bad("example.com"), K::Port);
        assert_eq!(bad("[::1]"), K::Port);
        assert_eq!(bad("example.com:0"), K::Port);
        assert_eq!(bad("example.com:65536"), K::Port);
        assert_eq!(bad("example.com:99999999"), K::Port);
        assert_eq!(bad("::1:443"), K::InvalidIpv6);
        assert_eq!(bad("http://example.com:443"), K::Path);
        assert_eq!(bad("example.com:443/"), K::Path);
        assert_eq!(bad("u@example.com:443"), K::Userinfo);
        assert_eq!(bad("example.com :443"), K::Whitespace);
        assert_eq!(bad("2130706433:443"), K::NumericIpv4);
        assert_eq!(bad("[fe80::1%eth0]:443"), K::ZoneId);
        assert_eq!(bad("[example.com]:443"), K::BracketedNonIpv6);
        assert_eq!(bad(""), K::Empty);
    }
}
