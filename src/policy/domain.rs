//! Registrable domains: the eTLD+1 of a host name under Mozilla's Public Suffix List
//! (<https://publicsuffix.org/list/>), compiled into the binary by the `psl` crate.
//!
//! Two features group hosts by who owns them: `airlock policy learn` proposes one entry per
//! registrable domain, and the review plane's `correlate.retry-after-deny` flag treats another
//! host of a denied host's registrable domain as "the same content, another way". Both read
//! canonical hosts (lowercase ASCII, punycode, no trailing dot: [`super::canonicalize_host`]).

use std::net::IpAddr;

/// The registrable domain (eTLD+1) of a canonical host name: `api.anthropic.com` →
/// `anthropic.com`, `www.example.co.uk` → `example.co.uk`, `user.github.io` → itself (the
/// list's private section makes `github.io` a suffix). `None` for an IP literal, a public
/// suffix itself (`co.uk`), or a name the list gives no registrable part (`localhost`).
///
/// A name under a TLD the list does not know takes the list's default rule (`*`: the last
/// label is the suffix), so `svc.corp.internal` → `corp.internal`.
pub fn registrable_domain(host: &str) -> Option<&str> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if bare.parse::<IpAddr>().is_ok() {
        return None;
    }
    let domain = psl::domain_str(host)?;
    // The default rule makes a lone label its own suffix, so it has no registrable part.
    (domain.contains('.')).then_some(domain)
}

/// Whether two hosts share a registrable domain (false when either has none).
pub fn same_registrable_domain(a: &str, b: &str) -> bool {
    match (registrable_domain(a), registrable_domain(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_the_public_suffix_list() {
        for (host, want) in [
            ("api.anthropic.com", Some("anthropic.com")),
            ("anthropic.com", Some("anthropic.com")),
            ("www.example.co.uk", Some("example.co.uk")),
            ("a.b.c.example.co.uk", Some("example.co.uk")),
            ("user.github.io", Some("user.github.io")),
            ("files.pythonhosted.org", Some("pythonhosted.org")),
            ("svc.corp.internal", Some("corp.internal")),
            ("api.anthropic.com.", Some("anthropic.com")),
            ("co.uk", None),
            ("github.io", None),
            ("com", None),
            ("localhost", None),
            ("127.0.0.1", None),
            ("10.1.2.3", None),
            ("::1", None),
            ("[2001:db8::1]", None),
        ] {
            assert_eq!(registrable_domain(host), want, "{host}");
        }
    }

    #[test]
    fn same_domain_needs_a_registrable_part_on_both_sides() {
        assert!(same_registrable_domain("api.anthropic.com", "statsig.anthropic.com"));
        assert!(!same_registrable_domain("a.github.io", "b.github.io"));
        assert!(!same_registrable_domain("127.0.0.1", "127.0.0.1"));
        assert!(!same_registrable_domain("example.com", "example.org"));
    }
}
