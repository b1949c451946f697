//! The layered evaluator (DESIGN §4): layers are *evaluated*, never merged.
//!
//! For a target `(host, port)`, in this order:
//! 1. a review-plane host (name and subdomains, any port; or that address) → deny `review_plane`;
//! 2. any matching `block` entry of any layer → deny `blocked`;
//! 3. if the managed layer has any `allow` entry, one of them must match, in both modes → else
//!    deny `managed_not_allowed`;
//! 4. a **name** in allowlist mode must match an `allow` entry of user∪repo∪operator → else
//!    deny `not_allowed`; in blocklist mode it is allowed with no rule.
//!    An **IP-literal** target is never matched by name entries: in *both* modes it must match
//!    an `allow` address entry of user∪repo∪operator (else `ip_not_allowed`; otherwise blocklist
//!    mode would let an agent dial a blocked name's address), and if it is special-purpose or
//!    one of the host's own addresses it must also lie in some layer's `allow_private` (else
//!    `private_address`).
//!
//! Addresses with embedded IPv4 are decided as that IPv4 address (see [`super::addr`]); block
//! ranges are checked against both the IPv6 form and the embedded IPv4 (refusing more, never
//! less). The reported allow rule is the most specific user/repo/operator entry: `=name` over
//! `name`, a longer suffix over a shorter one, a longer prefix over a shorter one, an explicit
//! port over `:*` over none, then layer and file order.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::addr::{effective, is_special_purpose};
use super::canon::Host;
use super::entry::{Entry, EntryKind, NameMatch, Pattern, PortSpec, name_covers};
use super::index::{NameIndex, PrefixIndex, Rule, RuleId};
use super::{Decision, LayerKind, Mode, Reason, Verdict};

/// One configuration layer as the config module parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyLayer {
    pub kind: LayerKind,
    /// The file as the user sees it, e.g. `~/.airlock/config.toml`.
    pub name: String,
    pub mode: Option<Mode>,
    pub allow: Vec<Entry>,
    pub block: Vec<Entry>,
    pub allow_private: Vec<IpNet>,
}

impl PolicyLayer {
    /// An empty layer of `kind` named `name`.
    pub fn new(kind: LayerKind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            mode: None,
            allow: Vec::new(),
            block: Vec::new(),
            allow_private: Vec::new(),
        }
    }
}

/// A review-plane server host: always refused, in both modes, on every port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewHost {
    pub host: Host,
    pub layer: LayerKind,
    /// The file that named it (`~/.airlock/identity.toml`, `/etc/airlock/policy.toml`, …).
    pub policy: String,
}

/// Something worth telling the user that does not stop evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyWarning {
    /// The same host (and range) is in an `allow` and a `block` list; the block wins.
    AllowAndBlock {
        allow: String,
        allow_layer: LayerKind,
        allow_policy: String,
        block: String,
        block_layer: LayerKind,
        block_policy: String,
    },
    /// The same entry (canonically) is listed twice.
    Duplicate {
        kind: EntryKind,
        entry: String,
        first_layer: LayerKind,
        first_policy: String,
        second_layer: LayerKind,
        second_policy: String,
    },
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AllowAndBlock {
                allow,
                allow_layer,
                allow_policy,
                block,
                block_layer,
                block_policy,
            } => write!(
                f,
                "{allow:?} is allowed in {allow_policy} ({allow_layer}) but {block:?} blocks it \
                 in {block_policy} ({block_layer}); the block wins"
            ),
            Self::Duplicate {
                kind,
                entry,
                first_layer,
                first_policy,
                second_layer,
                second_policy,
            } => {
                if first_policy == second_policy && first_layer == second_layer {
                    write!(f, "duplicate {kind} entry {entry:?} in {first_policy} ({first_layer})")
                } else {
                    write!(
                        f,
                        "duplicate {kind} entry {entry:?} in {first_policy} ({first_layer}) and \
                         {second_policy} ({second_layer})"
                    )
                }
            }
        }
    }
}

/// A policy that cannot be enforced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "refusing to start: the allowlist is empty. Add an entry such as \
         `[network] allow = [\"example.com\"]` to .airlock.toml (then `airlock policy trust`) \
         or ~/.airlock/config.toml{}",
        if *.managed_allow {
            "; the managed policy's allow entries only narrow the list, they never add to it"
        } else {
            ""
        }
    )]
    EmptyAllowlist {
        /// The managed layer has `allow` entries (which never count toward the list).
        managed_allow: bool,
    },
}

/// The host's own interface addresses (read by the caller at session start): refused as
/// targets and answers unless in `allow_private`, like special-purpose addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalAddrs(HashSet<IpAddr>);

impl LocalAddrs {
    pub fn new(addrs: Vec<IpAddr>) -> Self {
        let mut set = HashSet::with_capacity(addrs.len() * 2);
        for ip in addrs {
            set.insert(ip);
            set.insert(effective(ip));
        }
        Self(set)
    }

    pub fn none() -> Self {
        Self::default()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        !self.0.is_empty() && (self.0.contains(&ip) || self.0.contains(&effective(ip)))
    }
}

/// Where a rule id points: layer index, list, entry index.
#[derive(Clone, Copy, Debug)]
struct RuleSrc {
    layer: usize,
    kind: EntryKind,
    entry: usize,
}

/// The built evaluator. Immutable, `Send + Sync`; share it in an `Arc`.
#[derive(Debug)]
pub struct Policy {
    layers: Vec<PolicyLayer>,
    review: Vec<ReviewHost>,
    review_names: NameIndex,
    review_ips: PrefixIndex,
    rules: Vec<RuleSrc>,
    block_names: NameIndex,
    block_ips: PrefixIndex,
    managed_gate: Option<usize>,
    managed_names: NameIndex,
    managed_ips: PrefixIndex,
    allow_names: NameIndex,
    allow_ips: PrefixIndex,
    private: PrefixIndex,
    mode: Mode,
    mode_source: LayerKind,
    digest: String,
}

impl Policy {
    pub fn build(
        layers: Vec<PolicyLayer>,
        review_hosts: Vec<ReviewHost>,
    ) -> Result<(Policy, Vec<PolicyWarning>), PolicyError> {
        let (mode, mode_source) = pick_mode(&layers);
        let is_managed = |k: LayerKind| k == LayerKind::Managed;
        let user_allows = layers
            .iter()
            .filter(|l| !is_managed(l.kind) && l.kind != LayerKind::None)
            .any(|l| !l.allow.is_empty());
        let managed_gate = layers.iter().position(|l| is_managed(l.kind) && !l.allow.is_empty());
        if mode == Mode::Allowlist && !user_allows {
            return Err(PolicyError::EmptyAllowlist { managed_allow: managed_gate.is_some() });
        }

        let mut p = Policy {
            layers: Vec::new(),
            review: Vec::new(),
            review_names: NameIndex::default(),
            review_ips: PrefixIndex::default(),
            rules: Vec::new(),
            block_names: NameIndex::default(),
            block_ips: PrefixIndex::default(),
            managed_gate,
            managed_names: NameIndex::default(),
            managed_ips: PrefixIndex::default(),
            allow_names: NameIndex::default(),
            allow_ips: PrefixIndex::default(),
            private: PrefixIndex::default(),
            mode,
            mode_source,
            digest: String::new(),
        };

        for (li, layer) in layers.iter().enumerate() {
            for (kind, list) in [(EntryKind::Block, &layer.block), (EntryKind::Allow, &layer.allow)]
            {
                for (ei, entry) in list.iter().enumerate() {
                    let id = RuleId::try_from(p.rules.len()).unwrap_or(RuleId::MAX);
                    p.rules.push(RuleSrc { layer: li, kind, entry: ei });
                    // The list an entry sits in decides its meaning, whatever kind it was
                    // parsed as (the port default differs between allow and block).
                    let (names, ips) = match kind {
                        EntryKind::Block => (&mut p.block_names, &mut p.block_ips),
                        EntryKind::Allow if layer.kind == LayerKind::Managed => {
                            (&mut p.managed_names, &mut p.managed_ips)
                        }
                        EntryKind::Allow => (&mut p.allow_names, &mut p.allow_ips),
                    };
                    match entry.pattern() {
                        Pattern::Name { name, how } => names
                            .insert(name, Rule { how: *how, port: entry.port_spec(), kind, id }),
                        Pattern::Net(net) => ips.insert(
                            *net,
                            Rule { how: NameMatch::Tree, port: entry.port_spec(), kind, id },
                        ),
                    }
                }
            }
            for net in &layer.allow_private {
                let id = RuleId::try_from(li).unwrap_or(RuleId::MAX);
                let net = normalize_private(*net);
                p.private.insert(
                    net,
                    Rule { how: NameMatch::Tree, port: PortSpec::Any, kind: EntryKind::Allow, id },
                );
            }
        }
        for (ri, rh) in review_hosts.iter().enumerate() {
            let id = RuleId::try_from(ri).unwrap_or(RuleId::MAX);
            let rule =
                Rule { how: NameMatch::Tree, port: PortSpec::Any, kind: EntryKind::Block, id };
            match &rh.host {
                Host::Name(n) => p.review_names.insert(n, rule),
                Host::Ip(ip) => {
                    p.review_ips.insert(IpNet::from(*ip), rule);
                    p.review_ips.insert(IpNet::from(effective(*ip)), rule);
                }
            }
        }
        for idx in
            [&mut p.block_names, &mut p.managed_names, &mut p.allow_names, &mut p.review_names]
        {
            idx.finish();
        }
        for idx in [
            &mut p.block_ips,
            &mut p.managed_ips,
            &mut p.allow_ips,
            &mut p.private,
            &mut p.review_ips,
        ] {
            idx.finish();
        }

        let warnings = warnings(&layers);
        p.digest = digest(mode, &layers, &review_hosts);
        p.layers = layers;
        p.review = review_hosts;
        Ok((p, warnings))
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The layer whose `mode` is in force (`LayerKind::None` for the default).
    pub fn mode_source(&self) -> LayerKind {
        self.mode_source
    }

    pub fn layers(&self) -> &[PolicyLayer] {
        &self.layers
    }

    pub fn review_hosts(&self) -> &[ReviewHost] {
        &self.review
    }

    /// Stable SHA-256 (hex) of the effective rules: mode, each layer's kind and canonical
    /// entries in order, `allow_private`, review hosts. Display names are not included.
    pub fn digest(&self) -> String {
        self.digest.clone()
    }

    fn entry(&self, id: RuleId) -> (&PolicyLayer, &Entry) {
        let src = self.rules[id as usize];
        let layer = &self.layers[src.layer];
        let list = match src.kind {
            EntryKind::Allow => &layer.allow,
            EntryKind::Block => &layer.block,
        };
        (layer, &list[src.entry])
    }

    fn by_rule(&self, verdict: Verdict, reason: Reason, id: RuleId) -> Decision {
        let (layer, entry) = self.entry(id);
        Decision {
            verdict,
            reason,
            rule: Some(entry.text().to_owned()),
            layer: layer.kind,
            policy: Some(layer.name.clone()),
        }
    }

    fn review_plane(&self, id: RuleId) -> Decision {
        let rh = &self.review[id as usize];
        Decision {
            verdict: Verdict::Deny,
            reason: Reason::ReviewPlane,
            rule: Some(rh.host.to_string()),
            layer: rh.layer,
            policy: Some(rh.policy.clone()),
        }
    }

    fn managed_refusal(&self) -> Decision {
        let policy = self.managed_gate.map(|i| self.layers[i].name.clone());
        Decision {
            verdict: Verdict::Deny,
            reason: Reason::ManagedNotAllowed,
            rule: None,
            layer: LayerKind::Managed,
            policy,
        }
    }

    fn find_block_ip(&self, ip: IpAddr, port: u16) -> Option<Rule> {
        let eff = effective(ip);
        self.block_ips
            .find(eff, port)
            .or_else(|| if eff == ip { None } else { self.block_ips.find(ip, port) })
    }

    fn find_review_ip(&self, ip: IpAddr) -> Option<Rule> {
        let eff = effective(ip);
        self.review_ips.find(eff, 0).or_else(|| self.review_ips.find(ip, 0))
    }

    fn in_allow_private(&self, ip: IpAddr) -> bool {
        self.private.find(effective(ip), 0).is_some()
    }

    fn needs_private(&self, ip: IpAddr, local: &LocalAddrs) -> bool {
        is_special_purpose(ip) || local.contains(ip)
    }

    /// Decide a target. Names are decided by name entries only; IP literals by the address
    /// rule (module doc). Resolved answers of an allowed name go through [`Self::check_answer_port`].
    pub fn decide(&self, host: &Host, port: u16, local: &LocalAddrs) -> Decision {
        match host {
            Host::Name(name) => self.decide_name(name, port),
            Host::Ip(ip) => self.decide_ip(*ip, port, local),
        }
    }

    fn decide_name(&self, name: &str, port: u16) -> Decision {
        if let Some(r) = self.review_names.find(name, port) {
            return self.review_plane(r.id);
        }
        if let Some(r) = self.block_names.find(name, port) {
            return self.by_rule(Verdict::Deny, Reason::Blocked, r.id);
        }
        if self.managed_gate.is_some() && self.managed_names.find(name, port).is_none() {
            return self.managed_refusal();
        }
        match self.mode {
            Mode::Allowlist => match self.allow_names.find(name, port) {
                Some(r) => self.by_rule(Verdict::Allow, Reason::Allowed, r.id),
                None => Decision::refusal(Reason::NotAllowed),
            },
            Mode::Blocklist => Decision {
                verdict: Verdict::Allow,
                reason: Reason::Allowed,
                rule: None,
                layer: LayerKind::None,
                policy: None,
            },
        }
    }

    fn decide_ip(&self, ip: IpAddr, port: u16, local: &LocalAddrs) -> Decision {
        if let Some(r) = self.find_review_ip(ip) {
            return self.review_plane(r.id);
        }
        if let Some(r) = self.find_block_ip(ip, port) {
            return self.by_rule(Verdict::Deny, Reason::Blocked, r.id);
        }
        let eff = effective(ip);
        if self.managed_gate.is_some() && self.managed_ips.find(eff, port).is_none() {
            return self.managed_refusal();
        }
        let Some(allow) = self.allow_ips.find(eff, port) else {
            return Decision::refusal(Reason::IpNotAllowed);
        };
        if self.needs_private(ip, local) && !self.in_allow_private(ip) {
            return Decision::refusal(Reason::PrivateAddress);
        }
        self.by_rule(Verdict::Allow, Reason::Allowed, allow.id)
    }

    /// Check one resolved answer of an allowed name, ports aside: `None` = it may be dialed.
    /// Block ranges that name a port apply on every port here; prefer
    /// [`Self::check_answer_port`], which knows the port.
    pub fn check_answer(&self, ip: IpAddr, local: &LocalAddrs) -> Option<Decision> {
        self.answer(ip, None, local)
    }

    /// Check one resolved answer of an allowed name for a connection to `port`: `None` = it
    /// may be dialed; otherwise the refusal (`review_plane`, `blocked_address` naming the block
    /// entry, or `private_address`).
    pub fn check_answer_port(&self, ip: IpAddr, port: u16, local: &LocalAddrs) -> Option<Decision> {
        self.answer(ip, Some(port), local)
    }

    fn answer(&self, ip: IpAddr, port: Option<u16>, local: &LocalAddrs) -> Option<Decision> {
        if let Some(r) = self.find_review_ip(ip) {
            return Some(self.review_plane(r.id));
        }
        let block = match port {
            Some(port) => self.find_block_ip(ip, port),
            // Any port: probe with the entry's own port by asking for a rule that covers some
            // port; `:*`/default cover 0-probe, explicit ports are found by scanning.
            None => self.find_block_ip_any_port(ip),
        };
        if let Some(r) = block {
            return Some(self.by_rule(Verdict::Deny, Reason::BlockedAddress, r.id));
        }
        if self.needs_private(ip, local) && !self.in_allow_private(ip) {
            return Some(Decision::refusal(Reason::PrivateAddress));
        }
        None
    }

    fn find_block_ip_any_port(&self, ip: IpAddr) -> Option<Rule> {
        // A block entry without a port (or `:*`) covers port 0 too; one that names a port is
        // found by asking for that port. Block lists of addresses are short in practice, and
        // this path is only taken by callers that do not know the port.
        if let Some(r) = self.find_block_ip(ip, 0) {
            return Some(r);
        }
        self.rules
            .iter()
            .filter(|s| s.kind == EntryKind::Block)
            .filter_map(|s| match self.layers[s.layer].block[s.entry].port_spec() {
                PortSpec::Port(p) => Some(p),
                _ => None,
            })
            .find_map(|p| self.find_block_ip(ip, p))
    }

    /// Whether a CONNECT to this allowed target skips the TLS ClientHello peek: true when the
    /// user/repo/operator `allow` entry that matches it names its port explicitly (SECURITY §3:
    /// server-speaks-first protocols such as SSH).
    pub fn skip_sni_peek(&self, host: &Host, port: u16) -> bool {
        let rule = match host {
            Host::Name(n) => self.allow_names.find(n, port),
            Host::Ip(ip) => self.allow_ips.find(effective(*ip), port),
        };
        rule.is_some_and(|r| r.port != PortSpec::Default)
    }

    /// User/repo/operator `allow` entries that the managed `allow` list can never permit (no
    /// host and port matches both), for `policy show`. Empty when the managed layer has no
    /// `allow` entries.
    pub fn shadowed(&self) -> Vec<(LayerKind, String)> {
        let Some(mi) = self.managed_gate else {
            return Vec::new();
        };
        let managed = &self.layers[mi].allow;
        self.layers
            .iter()
            .filter(|l| l.kind != LayerKind::Managed)
            .flat_map(|l| l.allow.iter().map(move |e| (l.kind, e)))
            .filter(|(_, e)| !managed.iter().any(|m| overlaps(e, m)))
            .map(|(k, e)| (k, e.text().to_owned()))
            .collect()
    }
}

/// Managed pins; otherwise user, then operator (which counts like user), then repo.
fn pick_mode(layers: &[PolicyLayer]) -> (Mode, LayerKind) {
    for kind in [LayerKind::Managed, LayerKind::User, LayerKind::Operator, LayerKind::Repo] {
        if let Some(m) = layers.iter().filter(|l| l.kind == kind).find_map(|l| l.mode) {
            return (m, kind);
        }
    }
    (Mode::default(), LayerKind::None)
}

/// `allow_private` ranges written in an IPv4-embedding IPv6 form (`::ffff:10.0.0.0/104`) stand
/// for the IPv4 range, since addresses are decided as their embedded IPv4.
fn normalize_private(net: IpNet) -> IpNet {
    if let IpNet::V6(n) = net {
        let bits = u128::from(n.network());
        let low96 = [0xffffu128 << 32, 0x0064_ff9b << 96];
        if n.prefix_len() >= 96 && low96.iter().any(|p| bits >> 32 == p >> 32) {
            let v4 = std::net::Ipv4Addr::from(bits as u32);
            if let Ok(v4net) = ipnet::Ipv4Net::new(v4, n.prefix_len() - 96) {
                return IpNet::V4(v4net);
            }
        }
    }
    net
}

/// Some (host, port) matches both entries (both read as allow entries).
fn overlaps(a: &Entry, b: &Entry) -> bool {
    let ports = match (a.port_spec(), b.port_spec()) {
        (PortSpec::Any, _) | (_, PortSpec::Any) => true,
        (PortSpec::Default, PortSpec::Default) => true,
        (PortSpec::Port(p), PortSpec::Port(q)) => p == q,
        (PortSpec::Port(p), PortSpec::Default) | (PortSpec::Default, PortSpec::Port(p)) => {
            p == 80 || p == 443
        }
    };
    if !ports {
        return false;
    }
    match (a.pattern(), b.pattern()) {
        (Pattern::Name { name: x, how: hx }, Pattern::Name { name: y, how: hy }) => {
            match (hx, hy) {
                (NameMatch::Exact, _) => name_covers(y, *hy, x),
                (_, NameMatch::Exact) => name_covers(x, *hx, y),
                // Two subtree-ish patterns meet iff one name is equal to or below the other.
                _ => name_covers(x, NameMatch::Tree, y) || name_covers(y, NameMatch::Tree, x),
            }
        }
        (Pattern::Net(x), Pattern::Net(y)) => x.contains(&y.network()) || y.contains(&x.network()),
        _ => false,
    }
}

fn warnings(layers: &[PolicyLayer]) -> Vec<PolicyWarning> {
    let mut out = Vec::new();
    // Same pattern allowed (user/repo/operator or managed) and blocked.
    let mut allowed: HashMap<&Pattern, (&PolicyLayer, &Entry)> = HashMap::new();
    for l in layers {
        for e in &l.allow {
            allowed.entry(e.pattern()).or_insert((l, e));
        }
    }
    for l in layers {
        for e in &l.block {
            if let Some((al, ae)) = allowed.get(e.pattern()) {
                out.push(PolicyWarning::AllowAndBlock {
                    allow: ae.text().to_owned(),
                    allow_layer: al.kind,
                    allow_policy: al.name.clone(),
                    block: e.text().to_owned(),
                    block_layer: l.kind,
                    block_policy: l.name.clone(),
                });
            }
        }
    }
    // Duplicates within one role: block (all layers), managed allow, user∪repo∪operator allow.
    let mut seen: HashMap<(u8, String), (&PolicyLayer, &Entry)> = HashMap::new();
    for l in layers {
        let allow_role = if l.kind == LayerKind::Managed { 1 } else { 2 };
        for (role, list) in [(0u8, &l.block), (allow_role, &l.allow)] {
            for e in list {
                match seen.get(&(role, e.canonical())) {
                    Some((fl, fe)) => out.push(PolicyWarning::Duplicate {
                        kind: if role == 0 { EntryKind::Block } else { EntryKind::Allow },
                        entry: if fe.text() == e.text() {
                            e.text().to_owned()
                        } else {
                            format!("{} = {}", fe.text(), e.text())
                        },
                        first_layer: fl.kind,
                        first_policy: fl.name.clone(),
                        second_layer: l.kind,
                        second_policy: l.name.clone(),
                    }),
                    None => {
                        seen.insert((role, e.canonical()), (l, e));
                    }
                }
            }
        }
    }
    out
}

fn digest(mode: Mode, layers: &[PolicyLayer], review: &[ReviewHost]) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock-policy/1\n");
    h.update(format!("mode {}\n", mode.as_str()));
    for l in layers {
        h.update(format!("layer {}\n", l.kind));
        if let Some(m) = l.mode {
            h.update(format!("layer-mode {}\n", m.as_str()));
        }
        for e in &l.allow {
            h.update(format!("allow {}\n", e.canonical()));
        }
        for e in &l.block {
            h.update(format!("block {}\n", e.canonical()));
        }
        for n in &l.allow_private {
            h.update(format!("allow_private {n}\n"));
        }
    }
    for r in review {
        h.update(format!("review {}\n", r.host));
    }
    hex::encode(h.finalize())
}
