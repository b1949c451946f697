//! Action gates (docs/gates.md): a verified person approves one exact action before it happens.
//!
//! This module owns what a gate *is*, apart from who holds it: the [`Severity`] scale, the
//! canonical text of a held egress action and its digest ([`EgressAction`]), and the daemon's
//! [`GateBook`] of pending gates (open, list, wait for a change, decide once, expire,
//! abandon). The proxy holds the attempt ([`crate::proxy::gatehold`]); the policy says which
//! targets are gated ([`crate::policy::Policy::gate`]); the CLI decides
//! ([`crate::cli::gate`]).

pub mod book;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use book::{GateBook, OpenError, Ticket};

/// `[gate] timeout` when no layer sets it: below common client timeouts (Claude Code's Bash
/// tool gives a command 2 minutes), so the agent sees Airlock's `403 gate_expired` and not its
/// own timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(110);
/// The shortest and longest `[gate] timeout` a file may set.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The `[gate] timeout` in force among layers given as `(kind, timeout in ms)`: the managed
/// layer's, else the user's, the operator's, then the repo's (the order `mode` follows);
/// [`DEFAULT_TIMEOUT`] when none sets one. Clamped to [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`]: the
/// daemon rebuilds layers from documents it received, so a value is bounded again here.
pub fn timeout_of(
    layers: impl IntoIterator<Item = (crate::policy::LayerKind, Option<u64>)>,
) -> Duration {
    use crate::policy::LayerKind;
    let layers: Vec<_> = layers.into_iter().collect();
    [LayerKind::Managed, LayerKind::User, LayerKind::Operator, LayerKind::Repo]
        .iter()
        .find_map(|k| layers.iter().filter(|(kind, _)| kind == k).find_map(|(_, ms)| *ms))
        .map_or(DEFAULT_TIMEOUT, |ms| Duration::from_millis(ms).clamp(MIN_TIMEOUT, MAX_TIMEOUT))
}

/// Attempts one session may have held at once (beyond: `503 gate_limit`, audited): a session
/// that floods gate requests cannot bury a reviewer's queue or the daemon's memory.
pub const MAX_HELD_PER_SESSION: usize = 16;
/// Longest decision note kept (bytes, cut at a character boundary).
pub const MAX_NOTE: usize = 500;

/// How much a gated action matters (`[[gate.rule]] severity`); `high` will require the
/// decider's password with a review server (step-up).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    #[default]
    Medium,
    High,
}

impl Severity {
    pub const NAMES: &'static [&'static str] = &["low", "medium", "high"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "low" => Some(Self::Low),
            "medium" => Some(Self::Medium),
            "high" => Some(Self::High),
            _ => None,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One held egress attempt, as a decider approves it: exactly one connection (or one
/// plain-HTTP request) of one session to one host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAction<'a> {
    pub session: &'a str,
    /// The attempt's audit id: an approval is for this attempt and no other.
    pub attempt: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    pub port: u16,
    /// Plain HTTP: the request line (`GET http://host/path HTTP/1.1`).
    pub request: Option<&'a str>,
}

/// The canonical form: one JSON object, keys in a fixed (sorted) order, no whitespace.
#[derive(Serialize)]
struct Canonical<'a> {
    attempt: &'a str,
    host: &'a str,
    kind: &'static str,
    method: &'a str,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'a str>,
    session: &'a str,
}

impl EgressAction<'_> {
    /// The text a decision's digest is taken over.
    pub fn canonical(&self) -> String {
        let c = Canonical {
            attempt: self.attempt,
            host: self.host,
            kind: "egress",
            method: self.method,
            port: self.port,
            request: self.request,
            session: self.session,
        };
        // A struct of strings and an integer always serializes.
        serde_json::to_string(&c).unwrap_or_default()
    }
}

/// `sha256:<lowercase hex>` of `canonical`.
pub fn digest(canonical: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(canonical.as_bytes())))
}

/// One gated tool call, as a decider approves it: exactly this action text of this tool, asked
/// once by one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolAction<'a> {
    pub session: &'a str,
    /// The asking request's id: an approval is for this request and no other.
    pub attempt: &'a str,
    /// `Bash`, or what the asking agent named.
    pub tool: &'a str,
    /// The exact action (for Bash: the command line).
    pub action: &'a str,
}

#[derive(Serialize)]
struct ToolCanonical<'a> {
    action: &'a str,
    attempt: &'a str,
    kind: &'static str,
    session: &'a str,
    tool: &'a str,
}

impl ToolAction<'_> {
    /// The text a decision's digest is taken over (sorted keys, no whitespace).
    pub fn canonical(&self) -> String {
        let c = ToolCanonical {
            action: self.action,
            attempt: self.attempt,
            kind: "tool",
            session: self.session,
            tool: self.tool,
        };
        // A struct of strings always serializes.
        serde_json::to_string(&c).unwrap_or_default()
    }
}

/// Longest `[gate] commands` pattern.
pub const MAX_COMMAND_PATTERN: usize = 1024;

/// Whether `pattern` can be a `[gate] commands` entry: not empty, not only wildcards (it would
/// gate every command), no control characters, at most [`MAX_COMMAND_PATTERN`] bytes.
pub fn check_command_pattern(pattern: &str) -> Result<(), String> {
    if pattern.trim().is_empty() {
        return Err("it is empty; write a command prefix such as \"git push*\"".into());
    }
    if pattern.len() > MAX_COMMAND_PATTERN {
        return Err(format!("it is longer than {MAX_COMMAND_PATTERN} bytes"));
    }
    if pattern.chars().any(char::is_control) {
        return Err("it contains a control character".into());
    }
    if pattern.chars().all(|c| c == '*' || c == '?' || c.is_whitespace()) {
        return Err("it matches every command; name the command, e.g. \"terraform apply*\"".into());
    }
    Ok(())
}

/// The texts a command is matched as: the whole line (trimmed) and each simple command in it,
/// split at unquoted `&&`, `||`, `;`, `|`, `&`, newlines and parentheses or braces, each with
/// leading `NAME=value` assignments and the wrappers `sudo`, `env`, `command`, `exec`,
/// `nohup`, `time` taken off (`cd app && FOO=1 sudo git push` is a `git push*`). Quotes are
/// kept as written: `echo 'git push'` is an `echo`.
pub fn command_parts(command: &str) -> Vec<String> {
    let mut parts = vec![command.trim().to_owned()];
    let mut cur = String::new();
    let (mut single, mut double, mut escaped) = (false, false, false);
    let flush = |cur: &mut String, parts: &mut Vec<String>| {
        let p = strip_wrappers(cur.trim());
        if !p.is_empty() && !parts.iter().any(|q| q == p) {
            parts.push(p.to_owned());
        }
        cur.clear();
    };
    for c in command.chars() {
        if escaped {
            escaped = false;
            cur.push(c);
            continue;
        }
        match c {
            '\\' if !single => {
                escaped = true;
                cur.push(c);
            }
            '\'' if !double => {
                single = !single;
                cur.push(c);
            }
            '"' if !single => {
                double = !double;
                cur.push(c);
            }
            ';' | '&' | '|' | '\n' | '(' | ')' | '{' | '}' if !single && !double => {
                flush(&mut cur, &mut parts)
            }
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut parts);
    parts
}

fn strip_wrappers(mut s: &str) -> &str {
    const WRAPPERS: &[&str] = &["sudo", "env", "command", "exec", "nohup", "time"];
    loop {
        let (word, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        let assignment = word.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if (assignment || WRAPPERS.contains(&word)) && !rest.trim().is_empty() {
            s = rest.trim_start();
        } else {
            return s;
        }
    }
}

/// Glob match of a whole text: `*` any run of characters, `?` one character, runs of
/// whitespace in either compared as one space.
pub fn command_matches(pattern: &str, text: &str) -> bool {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (p, t): (Vec<char>, Vec<char>) =
        (norm(pattern).chars().collect(), norm(text).chars().collect());
    // Iterative wildcard matching with one backtrack point (linear in practice, never
    // exponential): the last `*` and where the text stood when it was seen.
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// One line naming what a gate holds, for terminals and pages: an egress gate's `METHOD
/// host:port` (an IPv6 host bracketed), a tool gate's `Tool: action`, an external gate's
/// action text. Not escaped: the caller escapes for where it shows it.
pub fn target_text(
    kind: &str,
    method: Option<&str>,
    host: Option<&str>,
    port: Option<u16>,
    request: Option<&str>,
) -> String {
    match kind {
        "egress" => {
            let host = host.unwrap_or("?");
            let host = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
            format!("{} {host}:{}", method.unwrap_or("?"), port.unwrap_or_default())
        }
        "tool" => format!("{}: {}", method.unwrap_or("tool"), request.unwrap_or("")),
        _ => request.unwrap_or("").to_owned(),
    }
}

/// `note` cut to [`MAX_NOTE`] bytes at a character boundary, control characters but newline
/// and tab replaced (it is shown on terminals and in the console).
pub fn clean_note(note: &str) -> String {
    let mut out = String::with_capacity(note.len().min(MAX_NOTE));
    for c in note.chars() {
        let c = if c.is_control() && c != '\n' && c != '\t' { '\u{FFFD}' } else { c };
        if out.len() + c.len_utf8() > MAX_NOTE {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn action<'a>(host: &'a str, request: Option<&'a str>) -> EgressAction<'a> {
        EgressAction { session: "s1", attempt: "a1", method: "CONNECT", host, port: 443, request }
    }

    #[test]
    fn canonical_text_is_sorted_compact_json() {
        assert_eq!(
            action("api.stripe.test", None).canonical(),
            r#"{"attempt":"a1","host":"api.stripe.test","kind":"egress","method":"CONNECT","port":443,"session":"s1"}"#
        );
        let with = action("h.test", Some("GET http://h.test/\"x\" HTTP/1.1")).canonical();
        let v: serde_json::Value = serde_json::from_str(&with).unwrap();
        assert_eq!(v["request"], "GET http://h.test/\"x\" HTTP/1.1");
    }

    #[test]
    fn the_digest_binds_every_part_of_the_action() {
        let base = digest(&action("a.test", None).canonical());
        assert!(base.starts_with("sha256:") && base.len() == 7 + 64, "{base}");
        let mut others = vec![
            digest(&action("b.test", None).canonical()),
            digest(&action("a.test", Some("GET / HTTP/1.1")).canonical()),
        ];
        let mut a = action("a.test", None);
        a.port = 8443;
        others.push(digest(&a.canonical()));
        let mut a = action("a.test", None);
        a.attempt = "a2";
        others.push(digest(&a.canonical()));
        let mut a = action("a.test", None);
        a.session = "s2";
        others.push(digest(&a.canonical()));
        for o in others {
            assert_ne!(o, base);
        }
    }

    #[test]
    fn targets_read_as_one_line_per_kind() {
        let t = |kind, host| target_text(kind, Some("CONNECT"), Some(host), Some(443), Some("x"));
        assert_eq!(t("egress", "pay.test"), "CONNECT pay.test:443");
        assert_eq!(t("egress", "2001:db8::1"), "CONNECT [2001:db8::1]:443");
        assert_eq!(
            target_text("tool", Some("Bash"), None, None, Some("git push")),
            "Bash: git push"
        );
        assert_eq!(target_text("external", None, None, None, Some("deploy v2")), "deploy v2");
    }

    #[test]
    fn notes_are_cut_and_cleaned() {
        assert_eq!(clean_note("ok\tfine\nline"), "ok\tfine\nline");
        assert_eq!(clean_note("a\u{1b}[31mb"), "a\u{FFFD}[31mb");
        let long = "é".repeat(400);
        let cut = clean_note(&long);
        assert!(cut.len() <= MAX_NOTE && cut.chars().all(|c| c == 'é'), "{}", cut.len());
    }

    #[test]
    fn command_patterns_match_whole_lines_and_simple_commands() {
        assert!(command_matches("git push*", "git push origin main"));
        assert!(command_matches("git push*", "git   push"));
        // A glob, not a word boundary: `git push *` needs the space.
        assert!(command_matches("git push*", "git pushy"));
        assert!(!command_matches("git push *", "git pushy"));
        assert!(command_matches("git push *", "git push origin"));
        assert!(!command_matches("git push *", "git status"));
        assert!(command_matches("kubectl delete*", "kubectl delete pod x"));
        assert!(command_matches("?s -l", "ls -l"));
        assert!(command_matches("*apply*", "terraform apply -auto-approve"));
        let parts = command_parts("cd /app && git push origin main | tee log");
        assert!(parts.iter().any(|p| p == "git push origin main"), "{parts:?}");
        for line in ["(cd x; FOO=1 sudo git push)", "true || env A=b git push -f", "x &\ngit push"]
        {
            let parts = command_parts(line);
            assert!(parts.iter().any(|p| command_matches("git push*", p)), "{line}: {parts:?}");
        }
        assert!(!command_parts("echo 'git push'").iter().any(|p| command_matches("git push*", p)));
        // Pathological patterns stay fast.
        let long = "a".repeat(5000);
        assert!(!command_matches(&"*a".repeat(200), &format!("{long}b")));
    }

    #[test]
    fn command_patterns_are_checked() {
        assert!(check_command_pattern("git push*").is_ok());
        for bad in ["", "  ", "*", "* ?", "a\u{1b}b"] {
            assert!(check_command_pattern(bad).is_err(), "{bad:?}");
        }
        assert!(check_command_pattern(&"x".repeat(2000)).is_err());
    }

    #[test]
    fn tool_actions_bind_the_exact_text() {
        let a = ToolAction { session: "s", attempt: "a", tool: "Bash", action: "git push" };
        assert_eq!(
            a.canonical(),
            r#"{"action":"git push","attempt":"a","kind":"tool","session":"s","tool":"Bash"}"#
        );
        let b = ToolAction { action: "git push --force", ..a.clone() };
        assert_ne!(digest(&a.canonical()), digest(&b.canonical()));
    }

    #[test]
    fn the_timeout_in_force_follows_the_layer_order_and_is_bounded() {
        use crate::policy::LayerKind as K;
        assert_eq!(timeout_of([]), DEFAULT_TIMEOUT);
        assert_eq!(timeout_of([(K::Repo, Some(5_000)), (K::User, None)]), Duration::from_secs(5));
        assert_eq!(
            timeout_of([(K::Repo, Some(5_000)), (K::User, Some(7_000))]),
            Duration::from_secs(7)
        );
        assert_eq!(
            timeout_of([(K::User, Some(7_000)), (K::Managed, Some(9_000))]),
            Duration::from_secs(9)
        );
        assert_eq!(timeout_of([(K::User, Some(10))]), MIN_TIMEOUT);
        assert_eq!(timeout_of([(K::User, Some(u64::MAX))]), MAX_TIMEOUT);
    }

    #[test]
    fn severities_parse_and_order() {
        for name in Severity::NAMES {
            assert_eq!(Severity::parse(name).unwrap().as_str(), *name);
        }
        assert!(Severity::parse("critical").is_none());
        assert!(Severity::Low < Severity::Medium && Severity::Medium < Severity::High);
    }
}
