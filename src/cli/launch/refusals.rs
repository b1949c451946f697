//! The end-of-session refusal summary: what this session's proxy refused, grouped by target and
//! reason (`pypi.org:443 not_allowed ×14`), each group with the fix a person can act on — the
//! exact `airlock policy allow …` command for a target no entry allows, the `allow_private`
//! entry for a private answer, nothing for malformed input.
//!
//! The facts are the session's own audit lines, read back from the repo's log directory after
//! the session ended (the daemon has flushed its pending `suppressed` summaries by then), so
//! any daemon version that writes audit lines serves it. Printed by the launch after the pty
//! relay has restored the terminal; every string from a line goes through
//! [`escape_for_terminal`] because an agent chose it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::audit::{AuditLine, Entry, Follower, escape_for_terminal as esc};
use crate::policy::{EntryKind, Reason};

/// Groups shown at most; the rest are counted in one line (`airlock logs --denied` has all).
const MAX_GROUPS: usize = 20;

/// One group of identical refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub host: String,
    /// `None` for DNS lines and lines without a port.
    pub port: Option<u16>,
    /// `DNS` for the sandbox resolver's refusals, else empty (a connection attempt).
    pub dns: bool,
    pub reason: Reason,
    pub count: u64,
    /// Refused answers (`refused_addrs`), first seen first, without repeats.
    pub addrs: Vec<String>,
    /// The refusing entry and its file, when one decided (`blocked`).
    pub rule: Option<String>,
    pub policy: Option<String>,
}

/// Key: (host, port, dns, reason).
type Key = (String, Option<u16>, bool, &'static str);

/// Groups the refused lines of `session` (a `suppressed` line counts its `count`). DNS refusals
/// of a name that also has a refused connection are left out: the connection's group says it.
pub fn summarize<'a>(lines: impl IntoIterator<Item = &'a AuditLine>, session: &str) -> Vec<Group> {
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    let mut order: Vec<Key> = Vec::new();
    for line in lines {
        // `INBOUND` lines are a host client's connections to a `--port`, not the agent's
        // attempts to get out: nothing a policy entry changes.
        if line.session != session
            || line.allowed
            || line.host.is_empty()
            || line.method == "INBOUND"
        {
            continue;
        }
        let Some(reason) = line.reason else { continue };
        if matches!(reason, Reason::Allowed | Reason::Interrupted) {
            continue;
        }
        let dns = line.method == "DNS";
        let key: Key =
            (line.host.clone(), if dns { None } else { line.port }, dns, reason.as_str());
        let group = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            Group {
                host: line.host.clone(),
                port: key.1,
                dns,
                reason,
                count: 0,
                addrs: Vec::new(),
                rule: line.rule.clone(),
                policy: line.policy.clone(),
            }
        });
        group.count = group.count.saturating_add(line.count.unwrap_or(1));
        for a in line.refused_addrs.iter().flatten() {
            if !group.addrs.contains(a) && group.addrs.len() < crate::audit::MAX_REFUSED_ADDRS {
                group.addrs.push(a.clone());
            }
        }
    }
    let connected: Vec<String> =
        groups.values().filter(|g| !g.dns).map(|g| g.host.clone()).collect();
    order
        .into_iter()
        .filter_map(|k| groups.remove(&k))
        .filter(|g| !(g.dns && connected.contains(&g.host)))
        .collect()
}

/// How the suggested commands name the repo: nothing when the caller runs them from inside it,
/// else `--repo DIR`.
#[derive(Debug, Clone, Default)]
pub struct Hints {
    pub repo_flag: Option<String>,
}

impl Hints {
    pub fn for_repo(repo_path: &Path, cwd: &Path) -> Self {
        let inside = crate::repo::Repo::resolve(None, cwd).is_ok_and(|r| r.path == repo_path);
        let repo_flag =
            (!inside).then(|| format!(" --repo {}", shell_word(&repo_path.display().to_string())));
        Self { repo_flag }
    }
}

/// The `allow` entry that would let this target through, validated with the config's parser.
/// Ports 80 and 443 get the bare name (an entry without a port covers both and keeps the TLS
/// SNI check, which an explicit port turns off for server-speaks-first protocols).
pub fn allow_entry(host: &str, port: Option<u16>) -> Option<String> {
    let host_part = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
    let entry = match port {
        None | Some(80 | 443) => host_part,
        Some(p) => format!("{host_part}:{p}"),
    };
    crate::policy::Entry::parse(&entry, EntryKind::Allow).ok().map(|_| entry)
}

/// `word` as one POSIX shell word: as is when it holds only safe characters, else quoted.
pub fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The summary's lines (empty when nothing was refused), ready for stderr.
pub fn render(groups: &[Group], hints: &Hints) -> Vec<String> {
    if groups.is_empty() {
        return Vec::new();
    }
    let total: u64 = groups.iter().map(|g| g.count).sum();
    let mut out = vec![format!(
        "airlock: this session's proxy refused {total} attempt{}:",
        if total == 1 { "" } else { "s" }
    )];
    let repo = hints.repo_flag.as_deref().unwrap_or("");
    let mut allow_cmds: Vec<String> = Vec::new();
    for g in groups.iter().take(MAX_GROUPS) {
        let target = match (g.port, g.dns) {
            (_, true) => format!("{} (DNS)", esc(&g.host)),
            (Some(p), _) if g.host.contains(':') => format!("[{}]:{p}", esc(&g.host)),
            (Some(p), _) => format!("{}:{p}", esc(&g.host)),
            (None, _) => esc(&g.host).into_owned(),
        };
        let mut line = format!("  {target} {} ×{}", g.reason, g.count);
        if let Some(hint) = hint(g, repo) {
            let _ = write!(line, " — {hint}");
        }
        out.push(line);
        if matches!(g.reason, Reason::NotAllowed | Reason::IpNotAllowed)
            && let Some(entry) = allow_entry(&g.host, g.port)
        {
            let cmd = format!("airlock policy allow {}{repo}", shell_word(&entry));
            if !allow_cmds.contains(&cmd) {
                allow_cmds.push(cmd);
            }
        }
    }
    if groups.len() > MAX_GROUPS {
        out.push(format!(
            "  … and {} more (see `airlock logs --denied`{repo})",
            groups.len() - MAX_GROUPS
        ));
    }
    if !allow_cmds.is_empty() {
        out.push("airlock: to allow them (repo layer; review first: the agent chose them):".into());
        for cmd in allow_cmds {
            out.push(format!("  {}", esc(&cmd)));
        }
    }
    out
}

/// What a person can do about one group (the `policy allow` commands are listed apart).
fn hint(g: &Group, repo: &str) -> Option<String> {
    let addrs: Vec<String> = g.addrs.iter().map(|a| format!("\"{}\"", esc(a))).collect();
    Some(match g.reason {
        Reason::NotAllowed | Reason::IpNotAllowed => return None,
        Reason::PrivateAddress if addrs.is_empty() => format!(
            "it resolves to a private or special-purpose address; if it is meant to, add that \
             address to [network] allow_private (docs/configuration.md; `airlock policy check \
             --resolve {}{repo}` shows the answers)",
            shell_word(&esc(&g.host))
        ),
        Reason::PrivateAddress => format!(
            "it resolved to {}; if it is meant to, add allow_private = [{}] under [network] in \
             ~/.airlock/config.toml or .airlock.toml (docs/configuration.md)",
            g.addrs.iter().map(|a| esc(a).into_owned()).collect::<Vec<_>>().join(", "),
            addrs.join(", ")
        ),
        Reason::Blocked | Reason::BlockedAddress => match (&g.rule, &g.policy) {
            (Some(rule), Some(policy)) => {
                format!("blocked by {:?} in {}", esc(rule), esc(policy))
            }
            _ => "a block entry refuses it".into(),
        },
        Reason::ManagedNotAllowed => {
            "the managed policy does not allow it; ask whoever manages this machine".into()
        }
        Reason::ReviewPlane => "a review-plane server is always refused".into(),
        Reason::SniMismatch | Reason::SniMissing => {
            "the TLS handshake did not name the host it connected to; not a policy fix".into()
        }
        Reason::UdpRefused => "only TCP leaves the sandbox, through the proxy".into(),
        Reason::ResolveFailed => "the name did not resolve on the host".into(),
        Reason::ConnectFailed => "the host did not accept the connection".into(),
        Reason::GateDenied => "an action gate: you (or the reviewer) denied it".into(),
        Reason::GateExpired => {
            "an action gate: no one decided in time; `airlock gate watch` shows the next one".into()
        }
        Reason::GateAbandoned => {
            "an action gate: the agent gave up, or the session stopped, before a decision".into()
        }
        Reason::GateLimit => "an action gate: too many attempts were waiting at once".into(),
        Reason::GateUnavailable => "an action gate, and no one can decide here".into(),
        _ => return None,
    })
}

/// Reads `session`'s lines from `dir` (audit files dated `since_date` or later) and returns the
/// summary's lines. A log that cannot be read gives one line saying so.
pub fn report(dir: &Path, since_date: &str, session: &str, hints: &Hints) -> Vec<String> {
    let mut lines: Vec<AuditLine> = Vec::new();
    let mut follower = Follower::new(dir).skip_files_before(since_date);
    let read = follower.poll(true, &mut |e| {
        if let Entry::Line { line, .. } = e
            && line.session == session
            && !line.allowed
        {
            lines.push(line);
        }
        true
    });
    if let Err(e) = read {
        return vec![format!(
            "airlock: warning: cannot read this session's refusals: {}",
            esc(&e.to_string())
        )];
    }
    render(&summarize(&lines, session), hints)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::test_sample_line;

    fn refused(host: &str, port: Option<u16>, reason: Reason) -> AuditLine {
        AuditLine {
            host: host.into(),
            port,
            allowed: false,
            reason: Some(reason),
            session: "s1".into(),
            addr: None,
            rule: None,
            ..test_sample_line()
        }
    }

    #[test]
    fn groups_count_suppressed_lines_and_skip_other_sessions_and_allowed() {
        let mut lines = vec![refused("pypi.org", Some(443), Reason::NotAllowed); 3];
        lines.push(AuditLine { count: Some(11), ..lines[0].clone() });
        lines.push(AuditLine { session: "other".into(), ..lines[0].clone() });
        lines.push(AuditLine { allowed: true, reason: Some(Reason::Allowed), ..lines[0].clone() });
        lines.push(AuditLine { method: "DNS".into(), port: None, ..lines[0].clone() });
        lines.push(AuditLine {
            method: "DNS".into(),
            port: None,
            ..refused("only-dns.test", None, Reason::NotAllowed)
        });
        let mut private = refused("intranet.test", Some(443), Reason::PrivateAddress);
        private.refused_addrs = Some(vec!["10.0.0.5".into()]);
        lines.push(private.clone());
        lines.push(private);
        lines.push(AuditLine {
            method: "INBOUND".into(),
            ..refused("127.0.0.1", Some(8080), Reason::ConnectFailed)
        });
        let groups = summarize(&lines, "s1");
        let got: Vec<(String, Option<u16>, bool, Reason, u64)> =
            groups.iter().map(|g| (g.host.clone(), g.port, g.dns, g.reason, g.count)).collect();
        assert_eq!(
            got,
            [
                ("pypi.org".into(), Some(443), false, Reason::NotAllowed, 14),
                ("only-dns.test".into(), None, true, Reason::NotAllowed, 1),
                ("intranet.test".into(), Some(443), false, Reason::PrivateAddress, 2),
            ]
        );
        assert_eq!(groups[2].addrs, ["10.0.0.5"]);
    }

    #[test]
    fn render_names_the_exact_commands_and_escapes() {
        let mut lines = vec![refused("pypi.org", Some(443), Reason::NotAllowed); 14];
        lines.push(refused("files.test", Some(8443), Reason::NotAllowed));
        lines.push(refused("2001:db8::1", Some(443), Reason::IpNotAllowed));
        let mut private = refused("intranet.test", Some(443), Reason::PrivateAddress);
        private.refused_addrs = Some(vec!["10.0.0.5".into()]);
        lines.push(private);
        lines.push(refused("evil\u{1b}[2J.test", Some(443), Reason::Malformed));
        let out = render(&summarize(&lines, "s1"), &Hints::default()).join("\n");
        assert!(out.contains("  pypi.org:443 not_allowed ×14"), "{out}");
        assert!(out.contains("  airlock policy allow pypi.org\n"), "{out}");
        assert!(out.contains("  airlock policy allow files.test:8443"), "{out}");
        assert!(out.contains("  airlock policy allow '[2001:db8::1]'"), "{out}");
        assert!(out.contains("allow_private = [\"10.0.0.5\"]"), "{out}");
        assert!(!out.contains("policy allow intranet"), "{out}");
        assert!(!out.contains('\u{1b}'), "{out:?}");
        assert!(out.contains(r"evil\u{1b}[2J.test:443 malformed ×1"), "{out}");
        assert!(!out.contains("policy allow evil"), "{out}");
        let hints = Hints { repo_flag: Some(" --repo '/a b'".into()) };
        let out = render(&summarize(&lines, "s1"), &hints).join("\n");
        assert!(out.contains("  airlock policy allow pypi.org --repo '/a b'"), "{out}");
        assert!(render(&[], &hints).is_empty());
    }

    #[test]
    fn shell_words_quote_what_a_shell_would_split() {
        assert_eq!(shell_word("/src/app"), "/src/app");
        assert_eq!(shell_word("/src/my app"), "'/src/my app'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn allow_entries_parse_as_config_entries() {
        assert_eq!(allow_entry("pypi.org", Some(443)).as_deref(), Some("pypi.org"));
        assert_eq!(allow_entry("pypi.org", Some(80)).as_deref(), Some("pypi.org"));
        assert_eq!(allow_entry("git.test", Some(22)).as_deref(), Some("git.test:22"));
        assert_eq!(allow_entry("::1", Some(443)).as_deref(), Some("[::1]"));
        assert_eq!(allow_entry("::1", Some(8080)).as_deref(), Some("[::1]:8080"));
        assert_eq!(allow_entry("bad host", Some(443)), None);
    }
}
