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
