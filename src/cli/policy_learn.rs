//! `airlock policy learn [--session ID | --since DUR] [--repo DIR] [--yes] [--private]`: read
//! this repo's audit lines (refused and allowed), propose the fewest `allow` entries that would
//! have let the refused attempts through, print them with a unified diff against the repo's
//! `.airlock.toml`, and write the file only when confirmed. Writing never records trust.
//!
//! The lines are streamed (one line in memory at a time; the aggregate is per distinct host
//! and port), so a million lines take well under the 2 s budget (docs/BENCHMARKS.md).
//!
//! Exit codes: 0 proposed, written, declined or nothing to propose; 2 usage; 3 a configuration
//! or file problem (the repo file does not parse, the logs cannot be read, the write failed).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, IsTerminal, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use clap::Args;
use serde::Deserialize;

use super::Context;
use super::logs::Since;
use crate::audit::{audit_files, logdir};
use crate::config::{self, ConfigError, LayerDoc, ParsedLayer, fsutil};
use crate::paths::Paths;
use crate::policy::{
    Decision, EntryKind, Host, LayerKind, LocalAddrs, Policy, Reason, canonicalize_host,
    is_special_purpose, registrable_domain,
};
use crate::repo::Repo;

const EXIT_CONFIG: i32 = 3;
/// Malformed lines reported one by one before only the count is given.
const BAD_LINES_SHOWN: usize = 5;

#[derive(Debug, Args)]
pub struct LearnArgs {
    /// Learn from this session's lines (`airlock logs sessions` lists them)
    #[arg(long, value_name = "ID", conflicts_with = "since")]
    pub session: Option<String>,
    /// Learn from every line since a duration ago (`2h`, `1day`) or a time (RFC 3339 or a
    /// UTC date); default: the repo's most recent session
    #[arg(long, value_name = "DURATION|TIME", value_parser = super::logs::parse_since)]
    pub since: Option<Since>,
    /// The repo directory (default: the git top level of the working directory)
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Write the proposed entries to the repo's .airlock.toml without asking (it stays
    /// untrusted until `airlock policy trust`)
    #[arg(long)]
    pub yes: bool,
    /// Also propose `allow_private` entries for refused special-purpose addresses
    #[arg(long)]
    pub private: bool,
}

/// The fields of an audit line that learning reads (borrowed: no copy per line).
#[derive(Debug, Deserialize)]
struct Slim<'a> {
    #[serde(borrow)]
    ts: Cow<'a, str>,
    #[serde(borrow)]
    host: Cow<'a, str>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    allowed: bool,
    #[serde(borrow)]
    session: Cow<'a, str>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default)]
    layer: Option<LayerKind>,
    #[serde(default, borrow)]
    rule: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    policy: Option<Cow<'a, str>>,
    /// `suppressed` lines: how many attempts the line stands for.
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    refused_addrs: Option<Vec<String>>,
    /// The phase in force when the attempt was decided (absent: the plain `[network]` lists).
    #[serde(default, borrow)]
    phase: Option<Cow<'a, str>>,
}

/// What the selected lines say about one host and port (`None`: a DNS line, no port).
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    pub allowed: u64,
    /// Refused attempts by reason code (few codes per target: a list).
    pub refused: Vec<(Reason, u64)>,
    /// The refusing rule, layer and file, as the last refusal names them.
    pub refused_by: Option<(String, LayerKind, Option<String>)>,
    /// Addresses the address guard refused (`private_address`).
    pub refused_addrs: BTreeSet<String>,
}

/// Attempts per host, then per port.
pub(crate) type Hosts = HashMap<String, BTreeMap<Option<u16>, Seen>>;

/// Every selected line, aggregated per (host, port), apart per phase: a phase's lists replace
/// `[network]`'s, so its refusals are decided, and proposed, against that phase.
#[derive(Debug, Default)]
pub(crate) struct Aggregate {
    /// Attempts decided by the plain `[network]` lists.
    pub seen: Hosts,
    /// Attempts decided while a phase was in force, per phase name.
    pub phased: BTreeMap<String, Hosts>,
    pub lines: u64,
    pub bad: u64,
}

impl Aggregate {
    /// Adds one line (the caller has selected it).
    fn add(&mut self, l: &Slim<'_>) {
        // Inbound, gate, stop lines and lines without a host are not egress attempts.
        if l.host.is_empty() || matches!(l.method.as_ref(), "INBOUND" | "GATE" | "STOP") {
            return;
        }
        let hosts = match l.phase.as_deref() {
            None => &mut self.seen,
            Some(ph) => match self.phased.get_mut(ph) {
                Some(h) => h,
                None => self.phased.entry(ph.to_owned()).or_default(),
            },
        };
        let ports = match hosts.get_mut(l.host.as_ref()) {
            Some(p) => p,
            None => hosts.entry(l.host.to_string()).or_default(),
        };
        let port = if l.method == "DNS" { None } else { l.port };
        let s = ports.entry(port).or_default();
        let n = l.count.unwrap_or(1);
        if l.allowed {
            s.allowed += n;
            return;
        }
        let reason = l
            .reason
            .as_deref()
            .and_then(|r| Reason::ALL.iter().copied().find(|c| c.as_str() == r))
            .unwrap_or(Reason::Malformed);
        match s.refused.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, c)) => *c += n,
            None => s.refused.push((reason, n)),
        }
        if let Some(layer) = l.layer.filter(|k| *k != LayerKind::None) {
            let rule = l.rule.as_deref().unwrap_or("").to_owned();
            s.refused_by = Some((rule, layer, l.policy.as_deref().map(str::to_owned)));
        }
        if let Some(addrs) = &l.refused_addrs {
            s.refused_addrs.extend(addrs.iter().cloned());
        }
    }
}

/// Which lines to learn from.
#[derive(Debug, Clone)]
pub(crate) enum Selection {
    Session(String),
    Since(String),
}

impl Selection {
    fn wants(&self, l: &Slim<'_>) -> bool {
        match self {
            Self::Session(s) => l.session == s.as_str(),
            // Both are RFC 3339 UTC with milliseconds, as the writer formats them: the text
            // order is the time order.
            Self::Since(t) => l.ts.as_ref() >= t.as_str(),
        }
    }

    /// A cheap pre-check on the raw line, before any JSON is parsed: a whole JSON object that
    /// does not even contain the session id is another session's. Anything else is parsed, so
    /// a malformed line is always reported.
    fn may_want(&self, raw: &str) -> bool {
        match self {
            Self::Session(s) => {
                !(raw.starts_with('{') && raw.ends_with('}')) || raw.contains(s.as_str())
            }
            Self::Since(_) => true,
        }
    }
}

/// Streams every `audit-<date>.jsonl` of `dir` (files older than `first_date` skipped),
/// aggregating the selected lines. Malformed lines are counted and the first few reported.
pub(crate) fn read_logs(
    dir: &Path,
    selection: &Selection,
    first_date: Option<&str>,
) -> Result<Aggregate, String> {
    let mut agg = Aggregate::default();
    let files = audit_files(dir).map_err(|e| e.to_string())?;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    for (date, path) in files {
        if first_date.is_some_and(|d| date.as_str() < d) {
            continue;
        }
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut lineno = 0usize;
        loop {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            lineno += 1;
            // A line that is not UTF-8 is one bad line, not an error.
            let line = std::str::from_utf8(&buf).unwrap_or("\u{fffd}");
            let line = line.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() || !selection.may_want(line) {
                continue;
            }
            match serde_json::from_str::<Slim<'_>>(line) {
                Ok(l) => {
                    if selection.wants(&l) {
                        agg.lines += 1;
                        agg.add(&l);
                    }
                }
                Err(e) => {
                    agg.bad += 1;
                    if agg.bad as usize <= BAD_LINES_SHOWN {
                        eprintln!(
                            "airlock: warning: {}:{lineno}: skipping a line that is not an audit \
                             line ({e})",
                            path.display()
                        );
                    }
                }
            }
        }
    }
    if agg.bad as usize > BAD_LINES_SHOWN {
        eprintln!(
            "airlock: warning: skipped {} malformed lines in all ({} shown above)",
            agg.bad, BAD_LINES_SHOWN
        );
    }
    Ok(agg)
}

/// The most recent session of the log directory: the latest session record's, else the
/// session of the latest audit line.
fn latest_session(dir: &Path) -> Result<Option<(String, String)>, String> {
    let mut best: Option<(String, String)> = None;
    let mut consider = |ts: &str, session: &str| {
        if best.as_ref().is_none_or(|(t, _)| ts > t.as_str()) {
            best = Some((ts.to_owned(), session.to_owned()));
        }
    };
    #[derive(Deserialize)]
    struct Rec<'a> {
        #[serde(borrow)]
        ts: Cow<'a, str>,
        #[serde(borrow)]
        session: Cow<'a, str>,
    }
    let sessions = crate::audit::dated_files(dir, "sessions").map_err(|e| e.to_string())?;
    let from_audit = sessions.is_empty();
    let files = if from_audit { audit_files(dir).map_err(|e| e.to_string())? } else { sessions };
    // Only the newest file can hold the newest record (files are per UTC date of the write).
    if let Some((_, path)) = files.last() {
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for line in BufReader::new(file).lines() {
            let Ok(line) = line else { continue };
            if let Ok(r) = serde_json::from_str::<Rec<'_>>(&line) {
                consider(&r.ts, &r.session);
            }
        }
    }
    Ok(best.map(|(ts, s)| (s, ts)))
}

/// Why a refused host is not proposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotProposed {
    pub target: String,
    pub why: String,
}

/// What learning proposes, for the plain lists or for one phase.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Proposal {
    /// The phase the refusals were decided under; its `allow` entries go into
    /// `[phase.NAME.network] allow` (`None`: `[network] allow`).
    pub phase: Option<String>,
    /// `allow` entries, each with the targets it covers.
    pub allow: Vec<(String, Vec<String>)>,
    /// `allow_private` networks (`--private`), each with the targets it covers.
    pub allow_private: Vec<(String, Vec<String>)>,
    pub not_proposed: Vec<NotProposed>,
    /// Targets already allowed (by the log's allowed lines or the policy as it is now).
    pub covered: Vec<String>,
    /// Refusals no policy entry causes (caps, resolution, malformed requests).
    pub ignored: u64,
}

fn authority(host: &str, port: Option<u16>) -> String {
    match (port, host.contains(':')) {
        (None, _) => host.to_owned(),
        (Some(p), true) => format!("[{host}]:{p}"),
        (Some(p), false) => format!("{host}:{p}"),
    }
}

/// A port an entry must name: 80 and 443 are what an entry without a port covers.
fn needed_port(port: Option<u16>) -> Option<u16> {
    port.filter(|p| !matches!(p, 80 | 443))
}

fn describe_rule(by: &Option<(String, LayerKind, Option<String>)>) -> String {
    match by {
        Some((rule, layer, Some(file))) if !rule.is_empty() => {
            format!("rule {rule:?} ({layer} layer, {file})")
        }
        Some((rule, layer, None)) if !rule.is_empty() => format!("rule {rule:?} ({layer} layer)"),
        Some((_, layer, _)) => format!("the {layer} layer"),
        None => "a rule".to_owned(),
    }
}

/// How the sandbox decides a target: a name without a port (a DNS line) as its resolver does,
/// allowed when the name is allowed on any port; anything else at its port (443 by default).
fn decide_at(policy: &Policy, host: &Host, port: Option<u16>) -> Decision {
    match (host, port) {
        (Host::Name(name), None) => policy.decide_name_any_port(name),
        _ => policy.decide(host, port.unwrap_or(443), &LocalAddrs::default()),
    }
}

/// Decides what to propose from what was seen (one phase's, or the plain lists'). `now`
/// decides a host and port (`None`: a DNS line) with the policy as it is now (`None` when the
/// policy cannot be built, e.g. an empty allowlist), as [`decide_at`] does.
pub(crate) fn propose(
    seen_hosts: &Hosts,
    now: &dyn Fn(&Host, Option<u16>) -> Option<Decision>,
    private: bool,
) -> Proposal {
    let mut out = Proposal::default();
    // (group key, port) → hosts, for names; IP literals stand alone.
    let mut names: BTreeMap<(String, Option<u16>), BTreeSet<String>> = BTreeMap::new();
    let mut hosts: Vec<&String> = seen_hosts.keys().collect();
    hosts.sort();
    for host_text in hosts {
        let Ok(host) = canonicalize_host(host_text) else {
            // Not a host an entry could name (a malformed request's fragment).
            out.ignored += seen_hosts[host_text]
                .values()
                .map(|s| s.refused.iter().map(|(_, n)| n).sum::<u64>())
                .sum::<u64>();
            continue;
        };
        // A refused DNS line of a name, proposed only if no port of the name is allowed or
        // proposed: the resolver answers a name allowed on any port, so `=host:8443` alone
        // also lets the lookup through (a port-less entry would widen it to 80/443).
        let mut dns_pending: Option<(String, String, String)> = None;
        // A port-specific target of this name that is allowed or proposed.
        let mut other_port: Option<String> = None;
        for (port, seen) in &seen_hosts[host_text] {
            let target = authority(host_text, *port);
            if seen.refused.is_empty() {
                if seen.allowed > 0 {
                    out.covered.push(format!("{target} (allowed {} times)", seen.allowed));
                    if port.is_some() {
                        other_port.get_or_insert_with(|| target.clone());
                    }
                }
                continue;
            }
            if seen.allowed > 0 {
                // Refused and allowed in one selection: something already lets it through.
                out.covered
                    .push(format!("{target} (allowed {} times, refused before)", seen.allowed));
                if port.is_some() {
                    other_port.get_or_insert_with(|| target.clone());
                }
                continue;
            }
            let mut fixable = false;
            for (reason, n) in &seen.refused {
                let why = match reason {
                    Reason::NotAllowed | Reason::IpNotAllowed => {
                        fixable = true;
                        continue;
                    }
                    Reason::Blocked => format!(
                        "blocked by {} ({n} attempts): an allow entry cannot lift a block",
                        describe_rule(&seen.refused_by)
                    ),
                    Reason::ManagedNotAllowed => format!(
                        "the managed layer's allow list does not include it ({n} attempts); \
                         only the fleet admin can change that"
                    ),
                    Reason::ReviewPlane => {
                        format!("a review-plane server ({n} attempts); always blocked")
                    }
                    Reason::BlockedAddress => format!(
                        "it resolved into a blocked CIDR ({n} attempts): {}",
                        describe_rule(&seen.refused_by)
                    ),
                    Reason::PrivateAddress if !private => format!(
                        "not proposed: needs --private (private_address: {} is special-purpose; \
                         {n} attempts)",
                        if seen.refused_addrs.is_empty() {
                            host_text.clone()
                        } else {
                            seen.refused_addrs.iter().cloned().collect::<Vec<_>>().join(", ")
                        }
                    ),
                    Reason::PrivateAddress => {
                        let addrs: Vec<String> = if seen.refused_addrs.is_empty() {
                            host.as_ip().map(|ip| vec![ip.to_string()]).unwrap_or_default()
                        } else {
                            seen.refused_addrs.iter().cloned().collect()
                        };
                        for a in addrs {
                            if let Ok(ip) = a.parse::<IpAddr>() {
                                let net = match ip {
                                    IpAddr::V4(_) => format!("{ip}/32"),
                                    IpAddr::V6(_) => format!("{ip}/128"),
                                };
                                push_covering(&mut out.allow_private, &net, &target);
                            }
                        }
                        continue;
                    }
                    Reason::UdpRefused => format!(
                        "UDP never leaves the sandbox ({n} datagrams; udp_refused); use TCP"
                    ),
                    Reason::SniMismatch | Reason::SniMissing => format!(
                        "the TLS ClientHello did not name the target ({reason}, {n} attempts)"
                    ),
                    Reason::GateDenied
                    | Reason::GateExpired
                    | Reason::GateLimit
                    | Reason::GateUnavailable
                    | Reason::GateAbandoned => {
                        format!("held by a [gate] and not approved ({reason}, {n} attempts)")
                    }
                    _ => {
                        // Caps, resolution and connection failures, malformed requests: not
                        // decided by an entry.
                        out.ignored += n;
                        continue;
                    }
                };
                out.not_proposed.push(NotProposed { target: target.clone(), why });
            }
            if !fixable {
                continue;
            }
            // The policy may have changed since: decide the target as it is now.
            let decision = now(&host, *port);
            if let Some(d) = &decision {
                if d.is_allowed() {
                    let by = match &d.rule {
                        Some(r) => format!(" by rule {r:?} ({} layer)", d.layer),
                        None => String::new(),
                    };
                    out.covered.push(format!("{target} (allowed now{by})"));
                    if port.is_some() {
                        other_port.get_or_insert_with(|| target.clone());
                    }
                    continue;
                }
                if !matches!(d.reason, Reason::NotAllowed | Reason::IpNotAllowed) {
                    out.not_proposed.push(NotProposed {
                        target: target.clone(),
                        why: format!(
                            "refused now as {} by {}",
                            d.reason,
                            describe_rule(&d.rule.clone().map(|r| (r, d.layer, d.policy.clone())))
                        ),
                    });
                    continue;
                }
            }
            let dns = port.is_none();
            let port = needed_port(*port);
            match host.as_ip() {
                Some(ip) => {
                    let special = is_special_purpose(ip);
                    if special && !private {
                        out.not_proposed.push(NotProposed {
                            target: target.clone(),
                            why: format!(
                                "not proposed: needs --private ({ip} is a special-purpose address)"
                            ),
                        });
                        continue;
                    }
                    let entry = match (ip, port) {
                        (IpAddr::V6(_), Some(p)) => format!("[{ip}]:{p}"),
                        (IpAddr::V6(_), None) => format!("[{ip}]"),
                        (IpAddr::V4(_), Some(p)) => format!("{ip}:{p}"),
                        (IpAddr::V4(_), None) => ip.to_string(),
                    };
                    push_covering(&mut out.allow, &entry, &target);
                    if special {
                        let net = match ip {
                            IpAddr::V4(_) => format!("{ip}/32"),
                            IpAddr::V6(_) => format!("{ip}/128"),
                        };
                        push_covering(&mut out.allow_private, &net, &target);
                    }
                }
                None => {
                    let name = host.as_name().unwrap_or(host_text).to_owned();
                    let key = registrable_domain(&name).unwrap_or(&name).to_owned();
                    if dns {
                        dns_pending = Some((key, name, target));
                    } else {
                        other_port.get_or_insert_with(|| target.clone());
                        names.entry((key, port)).or_default().insert(name);
                    }
                }
            }
        }
        if let Some((key, name, target)) = dns_pending {
            match other_port {
                Some(o) => out.covered.push(format!(
                    "{target} (DNS: answered once {o} is allowed; the resolver allows a name \
                     allowed on any port)"
                )),
                None => {
                    names.entry((key, None)).or_default().insert(name);
                }
            }
        }
    }
    for ((domain, port), members) in names {
        let suffix = port.map(|p| format!(":{p}")).unwrap_or_default();
        let covers: Vec<String> = members.iter().map(|h| authority(h, port)).collect();
        // Two or more hosts of one registrable domain: one entry for the domain; one host:
        // exactly that name.
        let entry = if members.len() >= 2 && registrable_domain(&domain).is_some() {
            format!("{domain}{suffix}")
        } else {
            format!("={}{suffix}", members.iter().next().map_or(domain.as_str(), |h| h.as_str()))
        };
        for c in covers {
            push_covering(&mut out.allow, &entry, &c);
        }
    }
    out.allow.sort();
    out.allow_private.sort();
    out.covered.sort();
    out
}

fn push_covering(list: &mut Vec<(String, Vec<String>)>, entry: &str, target: &str) {
    match list.iter_mut().find(|(e, _)| e == entry) {
        Some((_, covers)) => {
            if !covers.iter().any(|c| c == target) {
                covers.push(target.to_owned());
            }
        }
        None => list.push((entry.to_owned(), vec![target.to_owned()])),
    }
}

pub fn run(args: &LearnArgs, ctx: &Context<'_>) -> i32 {
    match learn(args, ctx) {
        Ok(code) => code,
        Err(msg) => {
            for line in msg.lines() {
                eprintln!("airlock: {line}");
            }
            EXIT_CONFIG
        }
    }
}

fn learn(args: &LearnArgs, ctx: &Context<'_>) -> Result<i32, String> {
    let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
    let repo = Repo::resolve(args.repo.as_deref(), &ctx.cwd).map_err(|e| e.to_string())?;
    let path = repo.config_file();
    let name = config::display_path(&paths, &path);
    // The file as it is now, trusted or not: the proposal is an edit of it.
    let old = fsutil::read_config(&path, false).map_err(|e| format!("cannot read {name}: {e}"))?;
    let old_text = match &old {
        Some(b) => String::from_utf8(b.clone())
            .map_err(|_| format!("{name} is not valid UTF-8; re-save it as UTF-8"))?,
        None => String::new(),
    };
    let parsed_old = match &old {
        Some(b) => Some(config::parse_layer(LayerKind::Repo, &name, b).map_err(|e| {
            format!("{e}\nnothing learned: fix {name} first (the proposal is an edit of it)")
        })?),
        None => None,
    };
    let Some(dir) =
        logdir::locate(&paths.logs_root(), &repo.name, &repo.path).map_err(|e| e.to_string())?
    else {
        println!(
            "no audit log for {} yet (run a session first); nothing to learn",
            repo.path.display()
        );
        return Ok(0);
    };
    let (selection, first_date) = match (&args.session, args.since) {
        (Some(s), _) => {
            println!("learning from session {s}");
            (Selection::Session(s.clone()), None)
        }
        (None, Some(since)) => {
            let cutoff = since.cutoff(SystemTime::now());
            let ts = crate::timefmt::rfc3339_ms(SystemTime::from(cutoff));
            let d = cutoff.to_offset(time::UtcOffset::UTC).date();
            let date = format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day());
            println!("learning from every line since {ts}");
            (Selection::Since(ts), Some(date))
        }
        (None, None) => match latest_session(&dir)? {
            Some((s, ts)) => {
                println!("learning from session {s} (the repo's most recent, {ts})");
                (Selection::Session(s), None)
            }
            None => {
                println!("no audit lines in {}; nothing to learn", dir.display());
                return Ok(0);
            }
        },
    };
    let agg = read_logs(&dir, &selection, first_date.as_deref())?;
    if agg.lines == 0 {
        println!("no audit lines selected in {}; nothing to learn", dir.display());
        return Ok(0);
    }
    let layers = other_layers(&paths)?;
    // The plain lists' refusals first, then each phase's, each decided by its own policy.
    let mut proposals = Vec::with_capacity(1 + agg.phased.len());
    let groups =
        std::iter::once((None, &agg.seen)).chain(agg.phased.iter().map(|(k, v)| (Some(k), v)));
    for (phase, hosts) in groups {
        let policy_now = build(&layers, parsed_old.as_ref(), phase.map(String::as_str))?;
        let now = |h: &Host, p: Option<u16>| policy_now.as_ref().map(|pol| decide_at(pol, h, p));
        let mut proposal = propose(hosts, &now, args.private);
        proposal.phase = phase.cloned();
        if let Some(ph) = phase
            && !parsed_old.as_ref().is_some_and(|p| p.doc.phases.contains_key(ph))
        {
            // `[network] allow` would apply in this phase, but also everywhere else; and a new
            // `[phase.NAME.network]` table would drop the file's other entries in the phase.
            // Neither is the minimal edit a user expects: say so instead.
            for (entry, covers) in std::mem::take(&mut proposal.allow) {
                for c in covers {
                    proposal.not_proposed.push(NotProposed {
                        target: c,
                        why: format!(
                            "refused under phase {ph}, which {name} does not define: not \
                             proposed ({entry}); add a [phase.{ph}.network] table to {name} \
                             and learn again, or `airlock policy allow {entry}` for [network] \
                             (every phase {name} does not define)"
                        ),
                    });
                }
            }
        }
        proposals.push(proposal);
    }
    print_proposal(&agg, &proposals);
    if proposals.iter().all(|p| p.allow.is_empty() && p.allow_private.is_empty()) {
        println!("nothing to propose: {name} is unchanged");
        return Ok(0);
    }
    let mut new_text = old_text.clone();
    for p in &proposals {
        let allow_in = allow_table(p.phase.as_deref());
        // `allow_private` has no phase form: it applies in every phase.
        for (table, key, list) in
            [(&allow_in, "allow", &p.allow), (&vec!["network"], "allow_private", &p.allow_private)]
        {
            for (entry, _) in list {
                if let Some(t) =
                    super::policy_edit::add_entry_in(&new_text, table, key, entry, EntryKind::Allow)
                        .map_err(|e| format!("{name}: {e}"))?
                {
                    new_text = t;
                }
            }
        }
    }
    let parsed_new = config::parse_layer(LayerKind::Repo, &name, new_text.as_bytes())
        .map_err(|e| format!("{e}\nnot written: the edited {name} would not load"))?;
    // What the proposal achieves, with the same evaluator in the same phase: a target still
    // refused is said.
    for prop in &proposals {
        let Ok(Some(p)) = build(&layers, Some(&parsed_new), prop.phase.as_deref()) else {
            continue;
        };
        for (_, covers) in &prop.allow {
            for c in covers {
                if let Ok(t) = crate::policy::parse_target(c) {
                    let d = decide_at(&p, &t.host, t.port);
                    if !d.is_allowed() {
                        eprintln!(
                            "airlock: warning: {c} would still be refused ({}) with the entries \
                             above",
                            d.reason
                        );
                    }
                }
            }
        }
    }
    let diff = similar::TextDiff::from_lines(&old_text, &new_text);
    let before = if old.is_some() { format!("{name} (before)") } else { "/dev/null".into() };
    print!("{}", diff.unified_diff().header(&before, &format!("{name} (after)")));
    let fix = format!("`airlock policy trust --repo {}`", repo.path.display());
    let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let confirmed =
        args.yes || (interactive && ask(&format!("Write these entries to {name}? [y/N] ")));
    if !confirmed {
        println!(
            "not written: run again with --yes to write {name} (then review it and run {fix})"
        );
        return Ok(0);
    }
    super::policy_edit::write_atomic(&path, new_text.as_bytes(), false)
        .map_err(|e| format!("cannot write {name}: {e}"))?;
    println!(
        "wrote {name}; it is NOT trusted, so it does not apply until you review it and run {fix} \
         (learning never records trust)"
    );
    Ok(0)
}

fn ask(prompt: &str) -> bool {
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// The managed and user layers, and the review-plane servers.
fn other_layers(paths: &Paths) -> Result<config::Loaded, String> {
    let identity = config::load_identity(paths).map_err(|e| e.to_string())?;
    config::load(paths, None, identity.as_ref()).map_err(|e| e.to_string())
}

/// The policy with `repo` as the repo layer, in `phase`; `None` when it is empty (nothing
/// allowed yet) or the phase is not defined (any more) or empty: nothing decides it now.
fn build(
    loaded: &config::Loaded,
    repo: Option<&ParsedLayer>,
    phase: Option<&str>,
) -> Result<Option<Policy>, String> {
    let docs: Vec<&LayerDoc> = [loaded.managed.as_ref(), loaded.user.as_ref(), repo]
        .into_iter()
        .flatten()
        .map(|p| &p.doc)
        .collect();
    match config::build_policy_in_phase(&docs, &loaded.review_servers, phase) {
        Ok(b) => Ok(Some(b.policy)),
        Err(ConfigError::EmptyAllowlist { .. }) => Ok(None),
        Err(ConfigError::Phase(_)) if phase.is_some() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The table a proposal's `allow` entries go into.
fn allow_table(phase: Option<&str>) -> Vec<&str> {
    match phase {
        Some(ph) => vec!["phase", ph, "network"],
        None => vec!["network"],
    }
}

fn print_proposal(agg: &Aggregate, proposals: &[Proposal]) {
    let all =
        || std::iter::once(&agg.seen).chain(agg.phased.values()).flat_map(|h| h.values()).flatten();
    let refused: u64 = all().flat_map(|(_, s)| s.refused.iter().map(|(_, n)| n)).sum();
    let allowed: u64 = all().map(|(_, s)| s.allowed).sum();
    println!("{} audit lines read: {refused} refused and {allowed} allowed attempts", agg.lines);
    for p in proposals {
        // Which list each entry goes into, and which phase's refusals the rest are.
        let under = p.phase.as_ref().map(|ph| format!(" (refused under phase {ph})"));
        let under = under.as_deref().unwrap_or("");
        if !p.allow.is_empty() {
            println!(
                "proposed [{}] allow entries{under}:",
                allow_table(p.phase.as_deref()).join(".")
            );
            for (entry, covers) in &p.allow {
                println!("  {entry:<32} covers {}", covers.join(", "));
            }
        }
        if !p.allow_private.is_empty() {
            println!("proposed [network] allow_private entries (--private){under}:");
            for (net, covers) in &p.allow_private {
                println!("  {net:<32} for {}", covers.join(", "));
            }
        }
        if !p.not_proposed.is_empty() {
            println!("not proposed{under}:");
            for n in &p.not_proposed {
                println!("  {}: {}", n.target, n.why);
            }
        }
        if !p.covered.is_empty() {
            println!("already allowed{under}:");
            for c in &p.covered {
                println!("  {c}");
            }
        }
        if p.ignored > 0 {
            println!(
                "ignored{under}: {} refusals no policy entry decides (caps, resolution or \
                 connection failures, malformed requests)",
                p.ignored
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn agg(lines: &[&str]) -> Aggregate {
        let mut a = Aggregate::default();
        for l in lines {
            a.add(&serde_json::from_str::<Slim<'_>>(l).unwrap());
        }
        a
    }

    fn line(host: &str, port: u16, allowed: bool, reason: &str) -> String {
        format!(
            r#"{{"ts":"2026-01-01T00:00:00.000Z","repo":"r","host":"{host}","method":"CONNECT","allowed":{allowed},"id":"x","session":"s","boot":"b","seq":1,"port":{port},"reason":"{reason}","layer":"none"}}"#
        )
    }

    fn never(_: &Host, _: Option<u16>) -> Option<Decision> {
        None
    }

    #[test]
    fn groups_by_domain_and_names_ports_only_when_needed() {
        let lines = [
            line("api.example.com", 443, false, "not_allowed"),
            line("cdn.example.com", 80, false, "not_allowed"),
            line("solo.test", 443, false, "not_allowed"),
            line("git.corp.example", 22, false, "not_allowed"),
            line("1.1.1.1", 443, false, "ip_not_allowed"),
            line("2606:4700::1111", 8443, false, "ip_not_allowed"),
        ];
        let a = agg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let p = propose(&a.seen, &never, false);
        let entries: Vec<&str> = p.allow.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(
            entries,
            [
                "1.1.1.1",
                "=git.corp.example:22",
                "=solo.test",
                "[2606:4700::1111]:8443",
                "example.com"
            ]
        );
    }

    #[test]
    fn private_blocked_and_managed_refusals_are_not_proposed() {
        let mut private = line("db.internal.test", 443, false, "private_address");
        private =
            private.replace(r#""layer":"none""#, r#""layer":"none","refused_addrs":["10.0.0.5"]"#);
        let blocked = line("pastebin.com", 443, false, "blocked")
            .replace(r#""layer":"none""#, r#""layer":"repo","rule":"pastebin.com""#);
        let lines = [
            private.clone(),
            blocked,
            line("x.test", 443, false, "managed_not_allowed"),
            line("10.1.2.3", 443, false, "ip_not_allowed"),
            line("u.test", 443, false, "udp_refused"),
            line("slow.test", 443, false, "resolve_failed"),
        ];
        let a = agg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let p = propose(&a.seen, &never, false);
        assert!(p.allow.is_empty(), "{p:?}");
        assert_eq!(p.ignored, 1);
        let whys: Vec<String> =
            p.not_proposed.iter().map(|n| format!("{}: {}", n.target, n.why)).collect();
        let all = whys.join("\n");
        for want in [
            "10.1.2.3:443: not proposed: needs --private",
            "db.internal.test:443: not proposed: needs --private (private_address: 10.0.0.5",
            "pastebin.com:443: blocked by rule \"pastebin.com\" (repo layer)",
            "x.test:443: the managed layer",
            "u.test:443: UDP never leaves the sandbox",
        ] {
            assert!(all.contains(want), "{want} in\n{all}");
        }
        let p = propose(&a.seen, &never, true);
        let nets: Vec<&str> = p.allow_private.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(nets, ["10.0.0.5/32", "10.1.2.3/32"]);
        assert_eq!(p.allow.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>(), ["10.1.2.3"]);
    }

    #[test]
    fn allowed_and_now_allowed_targets_are_not_reproposed() {
        let lines = [
            line("a.test", 443, true, "allowed"),
            line("b.test", 443, false, "not_allowed"),
            line("b.test", 443, true, "allowed"),
            line("c.test", 443, false, "not_allowed"),
        ];
        let a = agg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let now = |h: &Host, _: Option<u16>| {
            let mut d = Decision::refusal(Reason::NotAllowed);
            if h.as_name() == Some("c.test") {
                d.verdict = crate::policy::Verdict::Allow;
                d.reason = Reason::Allowed;
                d.rule = Some("c.test".into());
            }
            Some(d)
        };
        let p = propose(&a.seen, &now, false);
        assert!(p.allow.is_empty(), "{p:?}");
        assert_eq!(p.covered.len(), 3, "{:?}", p.covered);
    }

    #[test]
    fn dns_and_suppressed_lines_count() {
        let dns = r#"{"ts":"2026-01-01T00:00:00.000Z","repo":"r","host":"x.example.org","method":"DNS","allowed":false,"id":"x","session":"s","boot":"b","seq":1,"reason":"not_allowed","layer":"none","qtype":"A","answer":"NXDOMAIN"}"#;
        let sup = line("y.example.org", 443, false, "not_allowed")
            .replace(r#""layer":"none""#, r#""layer":"none","seqs":[[2,11]],"count":10"#);
        let a = agg(&[dns, &sup]);
        assert_eq!(a.seen["y.example.org"][&Some(443)].refused, [(Reason::NotAllowed, 10)]);
        let p = propose(&a.seen, &never, false);
        assert_eq!(
            p.allow,
            [(
                "example.org".to_owned(),
                vec!["x.example.org".to_owned(), "y.example.org".to_owned()]
            )]
        );
    }

    fn dns(host: &str) -> String {
        format!(
            r#"{{"ts":"2026-01-01T00:00:00.000Z","repo":"r","host":"{host}","method":"DNS","allowed":false,"id":"x","session":"s","boot":"b","seq":1,"reason":"not_allowed","layer":"none","qtype":"A","answer":"NXDOMAIN"}}"#
        )
    }

    #[test]
    fn a_dns_refusal_explained_by_a_port_specific_one_proposes_no_portless_entry() {
        let lines = [dns("git.corp.test"), line("git.corp.test", 8443, false, "not_allowed")];
        let a = agg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let p = propose(&a.seen, &never, false);
        let entries: Vec<&str> = p.allow.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(entries, ["=git.corp.test:8443"], "{p:?}");
        assert!(p.covered.iter().any(|c| c.starts_with("git.corp.test (DNS: answered once")));
        // A DNS refusal alone still proposes the name.
        let a = agg(&[&dns("solo.test")]);
        let p = propose(&a.seen, &never, false);
        assert_eq!(p.allow, [("=solo.test".to_owned(), vec!["solo.test".to_owned()])]);
    }

    #[test]
    fn a_dns_line_is_decided_as_the_resolver_does_on_any_port() {
        // The policy now allows only git.corp.test:8443: the resolver answers the name.
        let doc = config::parse_layer(
            LayerKind::Repo,
            "t",
            b"[network]\nallow = [\"=git.corp.test:8443\"]\n",
        )
        .unwrap();
        let pol = config::build_policy(&[&doc.doc], &[]).unwrap().policy;
        let now = |h: &Host, p: Option<u16>| Some(decide_at(&pol, h, p));
        let a = agg(&[&dns("git.corp.test")]);
        let p = propose(&a.seen, &now, false);
        assert!(p.allow.is_empty(), "{p:?}");
        assert_eq!(p.covered.len(), 1, "{:?}", p.covered);
    }

    #[test]
    fn phase_lines_are_aggregated_apart() {
        let phased = line("pypi.org", 443, false, "not_allowed")
            .replace(r#""layer":"none""#, r#""layer":"none","phase":"deps""#);
        let lines = [phased, line("plain.test", 443, false, "not_allowed")];
        let a = agg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(a.seen.contains_key("plain.test") && !a.seen.contains_key("pypi.org"));
        assert!(a.phased["deps"].contains_key("pypi.org"));
    }
}
