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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::addr::{effective, is_special_purpose, normalize_net};
use super::canon::Host;
use super::entry::{Entry, EntryKind, NameMatch, Pattern, PortSpec, name_covers};
use super::index::{NameIndex, PrefixIndex, Rule, RuleId};
use super::{Decision, LayerKind, Mode, Reason, Verdict};
use crate::gate::Severity;

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
    /// `[gate] hosts` and `[[gate.rule]]`: targets held for a person's decision once the rest
    /// of the policy allows them (docs/gates.md). A gate entry never allows anything by itself.
    pub gates: Vec<GateEntry>,
    /// `[gate] timeout`, in milliseconds (`None` when the file is silent).
    pub gate_timeout_ms: Option<u64>,
    /// `[gate] commands`: patterns of agents' shell commands asked for first.
    pub gate_commands: Vec<String>,
    /// `[phase.NAME.network]`: lists evaluated in place of `allow`/`block` while phase NAME is
    /// in force ([`Policy::build_in_phase`]).
    pub phases: BTreeMap<String, PhaseLists>,
}

/// One layer's `[phase.NAME.network]` block: its own `allow` and `block` lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseLists {
    pub allow: Vec<Entry>,
    pub block: Vec<Entry>,
}

/// One gated target: an entry in the `allow` syntax and how much approving it matters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateEntry {
    pub entry: Entry,
    pub severity: Severity,
}

/// The gate an allowed target falls under ([`Policy::gate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateMatch {
    /// The gate entry as written.
    pub rule: String,
    pub layer: LayerKind,
    /// The file that named it.
    pub policy: String,
    pub severity: Severity,
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
            gates: Vec::new(),
            gate_timeout_ms: None,
            gate_commands: Vec::new(),
            phases: BTreeMap::new(),
        }
    }

    /// This layer as evaluated while `phase` is in force: a layer that defines the phase has
    /// that block's lists in place of its own; any other layer is unchanged (everything but
    /// `allow` and `block` is always the layer's own).
    pub fn in_phase(&self, phase: &str) -> Self {
        let mut out = self.clone();
        if let Some(lists) = self.phases.get(phase) {
            out.allow = lists.allow.clone();
            out.block = lists.block.clone();
        }
        out
    }
}

/// Every phase name the layers define, sorted, each once.
pub fn phase_names(layers: &[PolicyLayer]) -> Vec<String> {
    let set: std::collections::BTreeSet<&String> =
        layers.iter().flat_map(|l| l.phases.keys()).collect();
    set.into_iter().cloned().collect()
}

/// The name agents ask for tool-call gates at (docs/gates.md); never a target.
pub const RESERVED_GATE_NAME: &str = "gate.airlock";

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
    /// No layer in force defines the phase asked for.
    #[error(
        "no layer in force defines phase {phase:?} ({}); add a [phase.{phase}.network] block \
         to a layer, or pick one of those",
        if defined.is_empty() { "none defines any phase".to_owned() }
        else { format!("defined: {}", defined.join(", ")) }
    )]
    UnknownPhase { phase: String, defined: Vec<String> },
    /// The phase's effective allowlist is empty (allowlist mode): entering it would refuse
    /// every attempt, so it is refused instead.
    #[error(
        "refusing to enter phase {phase:?}: its allowlist is empty (no layer's \
         [phase.{phase}.network] or, for a layer without that phase, [network] has an `allow` \
         entry{}); add `allow` entries to [phase.{phase}.network]",
        if *.managed_allow { "; the managed layer's allow entries only narrow the list" } else { "" }
    )]
    PhaseEmptyAllowlist { phase: String, managed_allow: bool },
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
    /// The ports at which a name's decision can differ ([`Self::decide_name_any_port`]): 80,
    /// 443, every port an entry names, and one port no entry names (standing for the rest).
    probe_ports: Vec<u16>,
    /// The phase in force ([`Self::build_in_phase`]); `None`: the plain `[network]` lists.
    phase: Option<String>,
}

impl Policy {
    pub fn build(
        layers: Vec<PolicyLayer>,
        review_hosts: Vec<ReviewHost>,
    ) -> Result<(Policy, Vec<PolicyWarning>), PolicyError> {
        let (mode, mode_source) = pick_mode(&layers);
        let is_managed = |k: LayerKind| k == LayerKind::Managed;
        let user_allows =
            layers.iter().filter(|l| !is_managed(l.kind)).any(|l| !l.allow.is_empty());
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
            probe_ports: Vec::new(),
            phase: None,
        };
        let mut ports = std::collections::BTreeSet::from([80u16, 443]);

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
                    if let PortSpec::Port(port) = entry.port_spec() {
                        ports.insert(port);
                    }
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
                let net = normalize_net(*net);
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

        // Decisions depend on the port only through the ports entries name (and 80/443 for
        // entries without one), so one unnamed port stands for every other.
        if let Some(other) = (1..=u16::MAX).find(|n| !ports.contains(n)) {
            ports.insert(other);
        }
        p.probe_ports = ports.into_iter().collect();
        let warnings = warnings(&layers);
        p.digest = digest(mode, &layers, &review_hosts);
        p.layers = layers;
        p.review = review_hosts;
        Ok((p, warnings))
    }

    /// [`Self::build`] with phase `phase` in force (`None`: the plain lists): each layer
    /// that defines the phase is evaluated with that block's `allow`/`block` in place of its
    /// own ([`PolicyLayer::in_phase`]); review-plane hosts, managed narrowing and the mode are
    /// unchanged, and the empty-allowlist rule applies to the phase's lists. A phase no layer
    /// defines is an error naming the ones defined.
    pub fn build_in_phase(
        layers: Vec<PolicyLayer>,
        review_hosts: Vec<ReviewHost>,
        phase: Option<&str>,
    ) -> Result<(Policy, Vec<PolicyWarning>), PolicyError> {
        let Some(phase) = phase else { return Self::build(layers, review_hosts) };
        if !layers.iter().any(|l| l.phases.contains_key(phase)) {
            return Err(PolicyError::UnknownPhase {
                phase: phase.to_owned(),
                defined: phase_names(&layers),
            });
        }
        let layers = layers.iter().map(|l| l.in_phase(phase)).collect();
        match Self::build(layers, review_hosts) {
            Ok((mut p, w)) => {
                p.phase = Some(phase.to_owned());
                Ok((p, w))
            }
            Err(PolicyError::EmptyAllowlist { managed_allow }) => {
                Err(PolicyError::PhaseEmptyAllowlist { phase: phase.to_owned(), managed_allow })
            }
            Err(e) => Err(e),
        }
    }

    /// The phase in force, if any.
    pub fn phase(&self) -> Option<&str> {
        self.phase.as_deref()
    }

    /// Every phase the layers define (sorted).
    pub fn phase_names(&self) -> Vec<String> {
        phase_names(&self.layers)
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

    /// A block range containing `ip` in its embedded-IPv4 or its own form; `port: None` means
    /// any block entry, whatever port it names.
    fn find_block_ip(&self, ip: IpAddr, port: Option<u16>) -> Option<Rule> {
        let find = |ip| match port {
            Some(port) => self.block_ips.find(ip, port),
            None => self.block_ips.find_any_port(ip),
        };
        let eff = effective(ip);
        find(eff).or_else(|| if eff == ip { None } else { find(ip) })
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

    /// A name as the resolver judges it (issue 14): allowed when some port of it is allowed.
    /// The first allowing decision is returned; when none allows, the decision at 443 (the
    /// refusal the name would get in a CONNECT to its usual port).
    pub fn decide_name_any_port(&self, name: &str) -> Decision {
        self.probe_ports
            .iter()
            .map(|p| self.decide_name(name, *p))
            .find(Decision::is_allowed)
            .unwrap_or_else(|| self.decide_name(name, 443))
    }

    fn decide_name(&self, name: &str, port: u16) -> Decision {
        // The tool-gate endpoint is answered by the proxy itself (`proxy::toolgate`): as a
        // target it is never allowed, so it is never resolved or dialed, in either mode.
        if name == RESERVED_GATE_NAME {
            return Decision {
                verdict: Verdict::Deny,
                reason: Reason::NotAllowed,
                rule: Some(RESERVED_GATE_NAME.to_owned()),
                layer: LayerKind::None,
                policy: Some("reserved: only POST http://gate.airlock/v1/gates is answered".into()),
            };
        }
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
        if let Some(r) = self.find_block_ip(ip, Some(port)) {
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
    /// A block range applies here whatever port it names (refusing more, never less); prefer
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
        let block = self.find_block_ip(ip, port);
        if let Some(r) = block {
            return Some(self.by_rule(Verdict::Deny, Reason::BlockedAddress, r.id));
        }
        if self.needs_private(ip, local) && !self.in_allow_private(ip) {
            return Some(Decision::refusal(Reason::PrivateAddress));
        }
        None
    }

    /// Whether a CONNECT to this allowed target skips the TLS ClientHello peek: true when the
    /// most specific user/repo/operator `allow` entry that matches it names its port explicitly
    /// (SECURITY §3: server-speaks-first protocols such as SSH). In blocklist mode the same
    /// entries are consulted, so `github.com:22` keeps SSH working there too. Call it only for
    /// targets [`Self::decide`] allowed.
    pub fn skip_sni_peek(&self, host: &Host, port: u16) -> bool {
        let rule = match host {
            Host::Name(n) => self.allow_names.find(n, port),
            Host::Ip(ip) => self.allow_ips.find(effective(*ip), port),
        };
        rule.is_some_and(|r| r.port != PortSpec::Default)
    }

    /// The gate a target the policy allowed falls under, if any: every layer's gates count
    /// (a managed gate cannot be lifted by another file), and of several matches the highest
    /// severity wins, then the first in layer and file order. Call it only for allowed targets;
    /// it says nothing about whether the target may be dialed.
    pub fn gate(&self, host: &Host, port: u16) -> Option<GateMatch> {
        self.best_gate(|e| e.matches(host, port))
    }

    /// The gate an allowed name falls under through its resolved `answers`: an address-range
    /// gate entry (`10.20.0.0/16:5432`) holds every name that resolves into it.
    pub fn gate_answers(&self, answers: &[IpAddr], port: u16) -> Option<GateMatch> {
        self.best_gate(|e| {
            matches!(e.pattern(), Pattern::Net(_))
                && answers.iter().any(|ip| e.matches(&Host::Ip(*ip), port))
        })
    }

    /// Whether some gate entry is an address range ([`Self::gate_answers`] can match).
    pub fn has_address_gates(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| &l.gates)
            .any(|g| matches!(g.entry.pattern(), Pattern::Net(_)))
    }

    /// Of the gate entries `hit` accepts, the highest severity, then the first in layer and
    /// file order.
    fn best_gate(&self, hit: impl Fn(&Entry) -> bool) -> Option<GateMatch> {
        let mut best: Option<(&PolicyLayer, &GateEntry)> = None;
        for layer in &self.layers {
            for g in layer.gates.iter().filter(|g| hit(&g.entry)) {
                if best.is_none_or(|(_, b)| g.severity > b.severity) {
                    best = Some((layer, g));
                }
            }
        }
        best.map(|(layer, g)| GateMatch {
            rule: g.entry.text().to_owned(),
            layer: layer.kind,
            policy: layer.name.clone(),
            severity: g.severity,
        })
    }

    /// The `[gate] commands` pattern a shell command falls under, if any: the whole text or
    /// any of its simple commands (`cd app && git push` is a `git push*`), first by layer and
    /// file order. Returns `(pattern, layer kind, file)`.
    pub fn gated_command(&self, command: &str) -> Option<GateMatch> {
        let parts = crate::gate::command_parts(command);
        for layer in &self.layers {
            for pattern in &layer.gate_commands {
                if parts.iter().any(|p| crate::gate::command_matches(pattern, p)) {
                    return Some(GateMatch {
                        rule: pattern.clone(),
                        layer: layer.kind,
                        policy: layer.name.clone(),
                        severity: Severity::Medium,
                    });
                }
            }
        }
        None
    }

    /// How long a held attempt waits for a decision: `[gate] timeout` of the managed layer,
    /// else the user's, the operator's, then the repo's; [`crate::gate::DEFAULT_TIMEOUT`] when
    /// none sets it.
    pub fn gate_timeout(&self) -> std::time::Duration {
        crate::gate::timeout_of(self.layers.iter().map(|l| (l.kind, l.gate_timeout_ms)))
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
        for g in &l.gates {
            h.update(format!("gate {} {}\n", g.entry.canonical(), g.severity));
        }
        if let Some(ms) = l.gate_timeout_ms {
            h.update(format!("gate-timeout {ms}\n"));
        }
        for c in &l.gate_commands {
            h.update(format!("gate-command {c:?}\n"));
        }
    }
    for r in review {
        h.update(format!("review {}\n", r.host));
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::{canonicalize_host, parse_authority, parse_target};
    use proptest::prelude::*;

    const USER: &str = "~/.airlock/config.toml";
    const REPO: &str = ".airlock.toml";
    const MANAGED: &str = "/etc/airlock/policy.toml";

    fn layer(kind: LayerKind, allow: &[&str], block: &[&str]) -> PolicyLayer {
        let name = match kind {
            LayerKind::Managed => MANAGED,
            LayerKind::User => USER,
            LayerKind::Repo => REPO,
            _ => "operator.toml",
        };
        let mut l = PolicyLayer::new(kind, name);
        l.allow = allow.iter().map(|s| Entry::parse(s, EntryKind::Allow).unwrap()).collect();
        l.block = block.iter().map(|s| Entry::parse(s, EntryKind::Block).unwrap()).collect();
        l
    }

    fn build(layers: Vec<PolicyLayer>) -> Policy {
        Policy::build(layers, Vec::new()).unwrap().0
    }

    fn decide(p: &Policy, target: &str, port: u16) -> Decision {
        p.decide(&canonicalize_host(target).unwrap(), port, &LocalAddrs::none())
    }

    fn reason(p: &Policy, target: &str, port: u16) -> Reason {
        decide(p, target, port).reason
    }

    fn gated(mut l: PolicyLayer, gates: &[(&str, Severity)]) -> PolicyLayer {
        l.gates = gates
            .iter()
            .map(|(t, severity)| GateEntry {
                entry: Entry::parse(t, EntryKind::Block).unwrap(),
                severity: *severity,
            })
            .collect();
        l
    }

    fn gate(p: &Policy, target: &str, port: u16) -> Option<GateMatch> {
        p.gate(&canonicalize_host(target).unwrap(), port)
    }

    /// `l` with phase `name` holding `allow`/`block`.
    fn phased(mut l: PolicyLayer, name: &str, allow: &[&str], block: &[&str]) -> PolicyLayer {
        let parse = |list: &[&str], kind| {
            list.iter().map(|s| Entry::parse(s, kind).unwrap()).collect::<Vec<_>>()
        };
        l.phases.insert(
            name.to_owned(),
            PhaseLists {
                allow: parse(allow, EntryKind::Allow),
                block: parse(block, EntryKind::Block),
            },
        );
        l
    }

    fn in_phase(layers: Vec<PolicyLayer>, review: Vec<ReviewHost>, phase: &str) -> Policy {
        Policy::build_in_phase(layers, review, Some(phase)).unwrap().0
    }

    #[test]
    fn a_phase_replaces_the_lists_of_the_layers_that_define_it_and_only_those() {
        let user =
            phased(layer(LayerKind::User, &["user.test"], &[]), "build", &["pypi.test"], &[]);
        let repo = phased(
            layer(LayerKind::Repo, &["repo.test"], &["bad.test"]),
            "build",
            &["files.test"],
            &["user.test"],
        );
        let other = layer(LayerKind::Repo, &["repo.test"], &["bad.test"]);
        let plain = build(vec![user.clone(), repo.clone()]);
        assert_eq!(plain.phase(), None);
        assert_eq!(reason(&plain, "pypi.test", 443), Reason::NotAllowed);
        assert_eq!(reason(&plain, "user.test", 443), Reason::Allowed);

        let p = in_phase(vec![user.clone(), repo], Vec::new(), "build");
        assert_eq!(p.phase(), Some("build"));
        // The user layer's phase lists replace its [network] lists…
        assert_eq!(reason(&p, "pypi.test", 443), Reason::Allowed);
        // …and the repo's phase block applies while its own block does not.
        assert_eq!(reason(&p, "user.test", 443), Reason::Blocked);
        assert_eq!(reason(&p, "bad.test", 443), Reason::NotAllowed);
        assert_eq!(reason(&p, "files.test", 443), Reason::Allowed);
        assert_eq!(decide(&p, "files.test", 443).rule.as_deref(), Some("files.test"));
        assert_eq!(reason(&p, "repo.test", 443), Reason::NotAllowed);

        // A layer without the phase keeps its own lists.
        let p = in_phase(vec![user, other], Vec::new(), "build");
        assert_eq!(reason(&p, "repo.test", 443), Reason::Allowed);
        assert_eq!(reason(&p, "bad.test", 443), Reason::Blocked);
        assert_eq!(reason(&p, "user.test", 443), Reason::NotAllowed);
        assert_eq!(p.phase_names(), ["build"]);
    }

    #[test]
    fn managed_narrowing_review_hosts_and_mode_hold_in_every_phase() {
        let managed = layer(LayerKind::Managed, &["corp.test"], &["leak.corp.test"]);
        let user = phased(
            layer(LayerKind::User, &["a.corp.test"], &[]),
            "deploy",
            &["b.corp.test", "leak.corp.test", "outside.test", "review.corp.test"],
            &[],
        );
        let review = vec![ReviewHost {
            host: canonicalize_host("review.corp.test").unwrap(),
            layer: LayerKind::User,
            policy: USER.into(),
        }];
        let p = in_phase(vec![managed.clone(), user.clone()], review.clone(), "deploy");
        assert_eq!(reason(&p, "b.corp.test", 443), Reason::Allowed);
        assert_eq!(reason(&p, "a.corp.test", 443), Reason::NotAllowed);
        // The managed layer still narrows, still blocks, and review hosts stay refused.
        assert_eq!(reason(&p, "outside.test", 443), Reason::ManagedNotAllowed);
        assert_eq!(reason(&p, "leak.corp.test", 443), Reason::Blocked);
        assert_eq!(reason(&p, "review.corp.test", 443), Reason::ReviewPlane);
        assert_eq!(p.mode(), Mode::Allowlist);

        // A managed phase replaces the managed lists (it still only narrows).
        let managed = phased(managed, "deploy", &["b.corp.test"], &[]);
        let p = in_phase(vec![managed, user], review, "deploy");
        assert_eq!(reason(&p, "b.corp.test", 443), Reason::Allowed);
        assert_eq!(reason(&p, "leak.corp.test", 443), Reason::ManagedNotAllowed);
        assert_eq!(reason(&p, "x.corp.test", 443), Reason::ManagedNotAllowed);
    }

    #[test]
    fn unknown_and_empty_phases_are_refused() {
        let user = phased(layer(LayerKind::User, &["a.test"], &[]), "build", &[], &["b.test"]);
        let repo = phased(layer(LayerKind::Repo, &[], &[]), "ship", &["c.test"], &[]);
        let err = Policy::build_in_phase(vec![user.clone()], Vec::new(), Some("bild")).unwrap_err();
        assert_eq!(
            err,
            PolicyError::UnknownPhase { phase: "bild".into(), defined: vec!["build".into()] }
        );
        // `build` leaves the user layer with no allow entry: nothing could be reached.
        let err =
            Policy::build_in_phase(vec![user.clone()], Vec::new(), Some("build")).unwrap_err();
        assert!(matches!(err, PolicyError::PhaseEmptyAllowlist { .. }), "{err}");
        assert!(err.to_string().starts_with("refusing to enter phase \"build\""), "{err}");
        // `ship` is defined by the repo only; the user layer keeps its own allow list.
        let p = in_phase(vec![user.clone(), repo.clone()], Vec::new(), "ship");
        assert_eq!(reason(&p, "a.test", 443), Reason::Allowed);
        assert_eq!(reason(&p, "c.test", 443), Reason::Allowed);
        assert_eq!(phase_names(&[user, repo]), ["build", "ship"]);
    }

    #[test]
    fn gates_match_in_the_allow_syntax_and_never_allow() {
        let repo = gated(
            layer(LayerKind::Repo, &["example.test"], &[]),
            &[("api.example.test", Severity::Medium), ("=db.example.test:5432", Severity::Low)],
        );
        let p = build(vec![repo]);
        let g = gate(&p, "x.api.example.test", 443).unwrap();
        assert_eq!(
            (g.rule.as_str(), g.layer, g.severity),
            ("api.example.test", LayerKind::Repo, Severity::Medium)
        );
        assert_eq!(g.policy, REPO);
        // Without a port a gate covers every port (like a block entry); `=` exactness and
        // explicit ports carry over.
        assert!(gate(&p, "api.example.test", 22).is_some());
        assert!(gate(&p, "api.example.test", 8443).is_some());
        assert!(gate(&p, "db.example.test", 5432).is_some());
        assert!(gate(&p, "x.db.example.test", 5432).is_none());
        assert!(gate(&p, "db.example.test", 443).is_none());
        // A gate entry alone allows nothing.
        let only_gate =
            gated(layer(LayerKind::User, &["other.test"], &[]), &[("pay.test", Severity::High)]);
        let p = build(vec![only_gate]);
        assert_eq!(reason(&p, "pay.test", 443), Reason::NotAllowed);
    }

    #[test]
    fn an_address_range_gate_holds_the_names_that_resolve_into_it() {
        let repo = gated(
            layer(LayerKind::Repo, &["db.test:*"], &[]),
            &[("10.20.0.0/16:5432", Severity::High)],
        );
        let p = build(vec![repo]);
        assert!(p.has_address_gates());
        assert!(gate(&p, "db.test", 5432).is_none(), "a name is not an address");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let g = p.gate_answers(&[ip("192.0.2.1"), ip("10.20.3.4")], 5432).unwrap();
        assert_eq!((g.rule.as_str(), g.severity), ("10.20.0.0/16:5432", Severity::High));
        assert!(p.gate_answers(&[ip("10.20.3.4")], 5433).is_none());
        assert!(p.gate_answers(&[ip("10.21.0.1")], 5432).is_none());
        // IPv4-mapped IPv6 answers are the same address.
        assert!(p.gate_answers(&[ip("::ffff:10.20.3.4")], 5432).is_some());
        let names_only = build(vec![gated(
            layer(LayerKind::Repo, &["a.test"], &[]),
            &[("a.test", Severity::Low)],
        )]);
        assert!(!names_only.has_address_gates());
    }

    #[test]
    fn a_managed_gate_stands_and_the_highest_severity_wins() {
        let managed =
            gated(PolicyLayer::new(LayerKind::Managed, MANAGED), &[("pay.test", Severity::High)]);
        let repo =
            gated(layer(LayerKind::Repo, &["pay.test"], &[]), &[("=api.pay.test", Severity::Low)]);
        let p = build(vec![managed, repo]);
        let g = gate(&p, "api.pay.test", 443).unwrap();
        assert_eq!((g.severity, g.layer), (Severity::High, LayerKind::Managed));
        assert_eq!(g.policy, MANAGED);
        assert!(gate(&p, "unrelated.test", 443).is_none());
    }

    #[test]
    fn the_tool_gate_name_is_never_a_target_in_either_mode() {
        for mode in [Mode::Allowlist, Mode::Blocklist] {
            let mut l = layer(LayerKind::User, &["gate.airlock", "*.airlock"], &[]);
            l.mode = Some(mode);
            let p = build(vec![l]);
            let d = decide(&p, "gate.airlock", 80);
            assert_eq!((d.verdict, d.reason), (Verdict::Deny, Reason::NotAllowed), "{mode:?}");
            assert_eq!(d.rule.as_deref(), Some("gate.airlock"));
            assert!(!p.decide_name_any_port("gate.airlock").is_allowed());
        }
    }

    #[test]
    fn gate_timeout_prefers_managed_then_user_then_repo() {
        let mut repo = layer(LayerKind::Repo, &["a.test"], &[]);
        repo.gate_timeout_ms = Some(5_000);
        let p = build(vec![repo.clone()]);
        assert_eq!(p.gate_timeout(), std::time::Duration::from_secs(5));
        let mut user = PolicyLayer::new(LayerKind::User, USER);
        user.gate_timeout_ms = Some(7_000);
        let p = build(vec![user.clone(), repo.clone()]);
        assert_eq!(p.gate_timeout(), std::time::Duration::from_secs(7));
        let mut managed = PolicyLayer::new(LayerKind::Managed, MANAGED);
        managed.gate_timeout_ms = Some(9_000);
        let p = build(vec![managed, user, repo]);
        assert_eq!(p.gate_timeout(), std::time::Duration::from_secs(9));
        let p = build(vec![layer(LayerKind::Repo, &["a.test"], &[])]);
        assert_eq!(p.gate_timeout(), crate::gate::DEFAULT_TIMEOUT);
    }

    #[test]
    fn gates_change_the_digest() {
        let plain = build(vec![layer(LayerKind::Repo, &["a.test"], &[])]);
        let with_gate = build(vec![gated(
            layer(LayerKind::Repo, &["a.test"], &[]),
            &[("a.test", Severity::Medium)],
        )]);
        let higher = build(vec![gated(
            layer(LayerKind::Repo, &["a.test"], &[]),
            &[("a.test", Severity::High)],
        )]);
        assert_ne!(plain.digest(), with_gate.digest());
        assert_ne!(with_gate.digest(), higher.digest());
    }

    #[test]
    fn policy_is_send_sync() {
        fn assert<T: Send + Sync>() {}
        assert::<Policy>();
    }

    #[test]
    fn allowlist_reports_rule_layer_and_file() {
        let p = build(vec![layer(LayerKind::Repo, &["anthropic.com"], &[])]);
        let d = decide(&p, "api.anthropic.com", 443);
        assert_eq!(
            d,
            Decision {
                verdict: Verdict::Allow,
                reason: Reason::Allowed,
                rule: Some("anthropic.com".into()),
                layer: LayerKind::Repo,
                policy: Some(REPO.into()),
            }
        );
        assert_eq!(decide(&p, "pastebin.com", 443), Decision::refusal(Reason::NotAllowed));
        assert_eq!(reason(&p, "api.anthropic.com", 22), Reason::NotAllowed);
        assert_eq!(reason(&p, "anthropic.com", 80), Reason::Allowed);
    }

    #[test]
    fn most_specific_allow_rule_is_reported() {
        let p = build(vec![
            layer(LayerKind::User, &["example.com", "*.api.example.com"], &[]),
            layer(LayerKind::Repo, &["=v1.api.example.com", "api.example.com:*"], &[]),
        ]);
        let rule = |t: &str, port| decide(&p, t, port).rule.unwrap();
        assert_eq!(rule("v1.api.example.com", 443), "=v1.api.example.com");
        assert_eq!(rule("v2.api.example.com", 443), "api.example.com:*"); // explicit port wins
        assert_eq!(rule("v2.api.example.com", 80), "api.example.com:*");
        assert_eq!(rule("v2.api.example.com", 8443), "api.example.com:*");
        assert_eq!(rule("api.example.com", 443), "api.example.com:*");
        assert_eq!(rule("www.example.com", 443), "example.com");
        assert_eq!(decide(&p, "v1.api.example.com", 443).layer, LayerKind::Repo);
        assert_eq!(decide(&p, "www.example.com", 443).layer, LayerKind::User);

        // A longer suffix beats a shorter one even when the shorter names its port.
        let p = build(vec![
            layer(LayerKind::User, &["example.com:443", "*.api.example.com"], &[]),
            layer(LayerKind::Repo, &["api.example.com:8443"], &[]),
        ]);
        let rule = |t: &str, port| decide(&p, t, port).rule.unwrap();
        assert_eq!(rule("v2.api.example.com", 443), "*.api.example.com");
        assert_eq!(rule("v2.api.example.com", 8443), "api.example.com:8443");
        assert_eq!(rule("api.example.com", 443), "example.com:443");
        assert_eq!(reason(&p, "api.example.com", 80), Reason::NotAllowed);
    }

    #[test]
    fn evaluation_order() {
        let managed = layer(LayerKind::Managed, &["example.com", "review.example.com"], &[]);
        let user = layer(LayerKind::User, &["example.com", "other.test"], &["bad.example.com"]);
        let repo = layer(LayerKind::Repo, &["bad.example.com"], &[]);
        let review = vec![ReviewHost {
            host: canonicalize_host("review.example.com").unwrap(),
            layer: LayerKind::User,
            policy: "~/.airlock/identity.toml".into(),
        }];
        let (p, warnings) = Policy::build(vec![managed, user, repo], review).unwrap();
        // 1. review plane beats everything, any port.
        let d = decide(&p, "x.review.example.com", 8443);
        assert_eq!(d.reason, Reason::ReviewPlane);
        assert_eq!(d.policy.as_deref(), Some("~/.airlock/identity.toml"));
        // 2. a block beats an allow in any layer.
        let d = decide(&p, "bad.example.com", 443);
        assert_eq!(
            (d.reason, d.rule.as_deref(), d.layer),
            (Reason::Blocked, Some("bad.example.com"), LayerKind::User)
        );
        // 3. the managed allow gates user∪repo.
        let d = decide(&p, "other.test", 443);
        assert_eq!(
            (d.reason, d.layer, d.policy.as_deref()),
            (Reason::ManagedNotAllowed, LayerKind::Managed, Some(MANAGED))
        );
        // 4. allowed by both → reported rule is the user/repo entry.
        let d = decide(&p, "www.example.com", 443);
        assert_eq!((d.reason, d.layer), (Reason::Allowed, LayerKind::User));
        assert!(warnings.iter().any(|w| matches!(w, PolicyWarning::AllowAndBlock { .. })));
    }

    #[test]
    fn managed_gate_applies_in_blocklist_mode_and_mode_precedence() {
        let mut managed = layer(LayerKind::Managed, &["example.com"], &[]);
        let mut user = layer(LayerKind::User, &[], &["evil.test"]);
        user.mode = Some(Mode::Blocklist);
        let p = build(vec![managed.clone(), user.clone()]);
        assert_eq!((p.mode(), p.mode_source()), (Mode::Blocklist, LayerKind::User));
        assert_eq!(reason(&p, "anything.test", 443), Reason::ManagedNotAllowed);
        let d = decide(&p, "www.example.com", 443);
        assert_eq!((d.reason, d.rule, d.layer), (Reason::Allowed, None, LayerKind::None));

        // Managed mode pins over the user's.
        managed.mode = Some(Mode::Allowlist);
        let err = Policy::build(vec![managed.clone(), user.clone()], vec![]).unwrap_err();
        assert_eq!(err, PolicyError::EmptyAllowlist { managed_allow: true });
        assert!(err.to_string().starts_with("refusing to start: the allowlist is empty"));
        assert!(err.to_string().contains("[network] allow = [\"example.com\"]"));

        // User beats repo; operator counts like user; default is allowlist.
        let mut repo = layer(LayerKind::Repo, &["a.test"], &[]);
        repo.mode = Some(Mode::Blocklist);
        let mut u2 = layer(LayerKind::User, &["a.test"], &[]);
        u2.mode = Some(Mode::Allowlist);
        let p = build(vec![u2, repo.clone()]);
        assert_eq!((p.mode(), p.mode_source()), (Mode::Allowlist, LayerKind::User));
        let p = build(vec![repo.clone()]);
        assert_eq!((p.mode(), p.mode_source()), (Mode::Blocklist, LayerKind::Repo));
        let mut op = layer(LayerKind::Operator, &["a.test"], &[]);
        op.mode = Some(Mode::Allowlist);
        let p = build(vec![op, repo]);
        assert_eq!((p.mode(), p.mode_source()), (Mode::Allowlist, LayerKind::Operator));
        let p = build(vec![layer(LayerKind::User, &["a.test"], &[])]);
        assert_eq!((p.mode(), p.mode_source()), (Mode::Allowlist, LayerKind::None));
    }

    #[test]
    fn empty_allowlist_ignores_managed_allow() {
        let err = Policy::build(vec![layer(LayerKind::Managed, &["example.com"], &[])], vec![])
            .unwrap_err();
        assert!(err.to_string().contains("only narrow"));
        let err = Policy::build(vec![layer(LayerKind::User, &[], &["x.test"])], vec![]);
        assert_eq!(err.unwrap_err(), PolicyError::EmptyAllowlist { managed_allow: false });
        assert!(Policy::build(vec![], vec![]).is_err());
        // Blocklist mode with no allow entries is fine.
        let mut l = layer(LayerKind::User, &[], &[]);
        l.mode = Some(Mode::Blocklist);
        assert!(Policy::build(vec![l], vec![]).is_ok());
    }

    #[test]
    fn block_ports() {
        let p = build(vec![layer(
            LayerKind::User,
            &["example.com:*", "10.0.0.0/8:*"],
            &["ssh.example.com:22", "=example.com", "10.9.0.0/16", "10.8.0.0/16:5432"],
        )]);
        assert_eq!(reason(&p, "ssh.example.com", 22), Reason::Blocked);
        assert_eq!(reason(&p, "ssh.example.com", 443), Reason::Allowed);
        for port in [1, 22, 80, 443, 8443, 65535] {
            assert_eq!(reason(&p, "example.com", port), Reason::Blocked, "port {port}");
            assert_eq!(reason(&p, "www.example.com", port), Reason::Allowed, "port {port}");
        }
        let mut user = p.layers()[0].clone();
        user.allow_private = vec!["10.0.0.0/8".parse().unwrap()];
        let p = build(vec![user]);
        assert_eq!(reason(&p, "10.9.1.1", 1), Reason::Blocked);
        assert_eq!(reason(&p, "10.8.1.1", 5432), Reason::Blocked);
        assert_eq!(reason(&p, "10.8.1.1", 5433), Reason::Allowed);
        assert_eq!(reason(&p, "[::ffff:10.9.1.1]", 443), Reason::Blocked);
    }

    #[test]
    fn ip_literal_targets() {
        let mut user = layer(
            LayerKind::User,
            &["example.com", "10.1.2.3:8443", "93.184.216.0/24", "[::1]:8080", "[2606:4700::/32]"],
            &["93.184.216.66"],
        );
        user.mode = Some(Mode::Blocklist);
        let p = build(vec![user.clone()]);
        // Name entries never match addresses; blocklist mode still needs an address allow.
        assert_eq!(reason(&p, "1.1.1.1", 443), Reason::IpNotAllowed);
        assert_eq!(reason(&p, "93.184.216.34", 443), Reason::Allowed);
        assert_eq!(reason(&p, "93.184.216.34", 22), Reason::IpNotAllowed);
        assert_eq!(reason(&p, "93.184.216.66", 443), Reason::Blocked);
        assert_eq!(reason(&p, "[::ffff:93.184.216.34]", 443), Reason::Allowed);
        assert_eq!(reason(&p, "[64:ff9b::93.184.216.34]", 443), Reason::Allowed);
        assert_eq!(reason(&p, "[::ffff:93.184.216.66]", 443), Reason::Blocked);
        assert_eq!(reason(&p, "2606:4700::1111", 443), Reason::Allowed);
        // Special-purpose: an allow entry alone is not enough.
        assert_eq!(reason(&p, "10.1.2.3", 8443), Reason::PrivateAddress);
        assert_eq!(reason(&p, "[::ffff:10.1.2.3]", 8443), Reason::PrivateAddress);
        assert_eq!(reason(&p, "::1", 8080), Reason::PrivateAddress);
        user.allow_private = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let p = build(vec![user.clone()]);
        assert_eq!(reason(&p, "10.1.2.3", 8443), Reason::Allowed);
        assert_eq!(reason(&p, "[::ffff:10.1.2.3]", 8443), Reason::Allowed);
        assert_eq!(reason(&p, "10.1.2.3", 443), Reason::IpNotAllowed);
        assert_eq!(reason(&p, "::1", 8080), Reason::Allowed);
        // allow_private written in mapped form stands for the IPv4 range.
        user.allow_private = vec!["::ffff:10.0.0.0/104".parse().unwrap()];
        let p = build(vec![user.clone()]);
        assert_eq!(reason(&p, "10.1.2.3", 8443), Reason::Allowed);
        // The host's own addresses count as private.
        let local = LocalAddrs::new(vec!["93.184.216.34".parse().unwrap()]);
        let h = canonicalize_host("93.184.216.34").unwrap();
        assert_eq!(p.decide(&h, 443, &local).reason, Reason::PrivateAddress);
        let h6 = canonicalize_host("::ffff:93.184.216.34").unwrap();
        assert_eq!(p.decide(&h6, 443, &local).reason, Reason::PrivateAddress);
        // Managed gate applies to addresses.
        let managed = layer(LayerKind::Managed, &["example.com"], &[]);
        let p = build(vec![managed, user]);
        assert_eq!(reason(&p, "93.184.216.34", 443), Reason::ManagedNotAllowed);
    }

    #[test]
    fn answers() {
        let mut user =
            layer(LayerKind::User, &["example.com"], &["203.0.113.0/24", "8.8.4.0/24:53"]);
        user.allow_private = vec!["192.168.1.0/24".parse().unwrap()];
        let review = vec![ReviewHost {
            host: canonicalize_host("1.2.3.4").unwrap(),
            layer: LayerKind::Managed,
            policy: MANAGED.into(),
        }];
        let (p, _) = Policy::build(vec![user], review).unwrap();
        let none = LocalAddrs::none();
        let ans = |s: &str| p.check_answer(s.parse().unwrap(), &none).map(|d| d.reason);
        let ans_port =
            |s: &str, port| p.check_answer_port(s.parse().unwrap(), port, &none).map(|d| d.reason);
        assert_eq!(ans("93.184.216.34"), None);
        assert_eq!(ans("2606:4700::1111"), None);
        assert_eq!(ans("127.0.0.1"), Some(Reason::PrivateAddress));
        assert_eq!(ans("::ffff:127.0.0.1"), Some(Reason::PrivateAddress));
        assert_eq!(ans("64:ff9b::a9fe:a9fe"), Some(Reason::PrivateAddress));
        assert_eq!(ans("::1"), Some(Reason::PrivateAddress));
        assert_eq!(ans("fe80::1"), Some(Reason::PrivateAddress));
        assert_eq!(ans("192.168.1.7"), None);
        assert_eq!(ans("::ffff:192.168.1.7"), None);
        assert_eq!(ans("192.168.2.7"), Some(Reason::PrivateAddress));
        // Block ranges apply to answers, naming the entry (TEST-NET-3 is also special: the
        // block is reported first).
        let d = p.check_answer("203.0.113.9".parse().unwrap(), &none).unwrap();
        assert_eq!(
            (d.reason, d.rule.as_deref(), d.layer),
            (Reason::BlockedAddress, Some("203.0.113.0/24"), LayerKind::User)
        );
        assert_eq!(ans("8.8.4.4"), Some(Reason::BlockedAddress)); // port unknown: conservative
        assert_eq!(ans_port("8.8.4.4", 53), Some(Reason::BlockedAddress));
        assert_eq!(ans_port("8.8.4.4", 443), None);
        assert_eq!(ans("1.2.3.4"), Some(Reason::ReviewPlane));
        let local = LocalAddrs::new(vec!["93.184.216.34".parse().unwrap()]);
        assert_eq!(
            p.check_answer("93.184.216.34".parse().unwrap(), &local).map(|d| d.reason),
            Some(Reason::PrivateAddress)
        );
    }

    #[test]
    fn sni_peek_skipped_only_for_explicit_ports() {
        let p = build(vec![layer(
            LayerKind::User,
            &["github.com", "github.com:22", "*.example.com:*", "10.0.0.1:5432"],
            &[],
        )]);
        let h = |s: &str| canonicalize_host(s).unwrap();
        assert!(p.skip_sni_peek(&h("github.com"), 22));
        assert!(!p.skip_sni_peek(&h("github.com"), 443));
        assert!(p.skip_sni_peek(&h("a.example.com"), 443));
        assert!(p.skip_sni_peek(&h("10.0.0.1"), 5432));
        assert!(!p.skip_sni_peek(&h("other.test"), 443));
    }

    #[test]
    fn shadowed_entries() {
        let managed = layer(LayerKind::Managed, &["example.com", "10.0.0.0/8", "git.test:22"], &[]);
        let user = layer(
            LayerKind::User,
            &["api.example.com", "other.test", "*.test", "10.1.0.0/16", "11.0.0.0/8", "git.test"],
            &[],
        );
        let repo = layer(LayerKind::Repo, &["=example.com:8443", "com", "git.test:22"], &[]);
        let p = build(vec![managed, user, repo]);
        assert_eq!(
            p.shadowed(),
            vec![
                (LayerKind::User, "other.test".to_owned()),
                (LayerKind::User, "*.test".to_owned()), // managed has only git.test:22
                (LayerKind::User, "11.0.0.0/8".to_owned()),
                (LayerKind::User, "git.test".to_owned()),
                (LayerKind::Repo, "=example.com:8443".to_owned()),
            ]
        );
        let p = build(vec![layer(LayerKind::User, &["a.test"], &[])]);
        assert!(p.shadowed().is_empty());
    }

    #[test]
    fn warnings_name_layers_and_files() {
        let user = layer(LayerKind::User, &["example.com", "a.test", "A.test."], &["x.test"]);
        let repo = layer(LayerKind::Repo, &["a.test"], &["example.com", "x.test"]);
        let (_, w) = Policy::build(vec![user, repo], vec![]).unwrap();
        let text: Vec<String> = w.iter().map(|w| w.to_string()).collect();
        assert!(
            text.contains(&format!(
                "\"example.com\" is allowed in {USER} (user) but \"example.com\" blocks it in \
                 {REPO} (repo); the block wins"
            )),
            "{text:?}"
        );
        assert!(
            text.contains(&format!("duplicate allow entry \"a.test = A.test.\" in {USER} (user)")),
            "{text:?}"
        );
        assert!(text.contains(&format!(
            "duplicate allow entry \"a.test\" in {USER} (user) and {REPO} (repo)"
        )));
        assert!(text.contains(&format!(
            "duplicate block entry \"x.test\" in {USER} (user) and {REPO} (repo)"
        )));
        assert_eq!(text.len(), 4, "{text:?}");
    }

    #[test]
    fn digest_is_stable_and_tracks_rules() {
        let a = build(vec![layer(LayerKind::User, &["a.test", "b.test"], &[])]);
        let b = build(vec![layer(LayerKind::User, &["A.test.", "b.test"], &[])]);
        let c = build(vec![layer(LayerKind::User, &["a.test", "c.test"], &[])]);
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest().len(), 64);
        // Pinned: a change here is a change to every session record's policy digest.
        assert_eq!(
            build(vec![layer(LayerKind::User, &["example.com"], &[])]).digest(),
            hex::encode(Sha256::digest(
                b"airlock-policy/1\nmode allowlist\nlayer user\nallow example.com\n"
            ))
        );
    }

    // ---- property tests ----

    fn label() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]{1,3}",
            "[a-z0-9]{1,6}[a-z]",
            Just("xn--bcher-kva".to_owned()),
            "[a-zA-Z0-9-]{1,10}",
            "[a-zé]{1,4}",
        ]
    }

    fn name() -> impl Strategy<Value = String> {
        prop::collection::vec(label(), 1..5).prop_map(|v| v.join("."))
    }

    /// Small alphabet so targets and entries often relate.
    fn small_name() -> impl Strategy<Value = String> {
        prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..4)
            .prop_map(|v| v.join("."))
    }

    fn entry_text() -> impl Strategy<Value = String> {
        (small_name(), 0..3usize, prop_oneof![Just(""), Just(":443"), Just(":22"), Just(":*")])
            .prop_map(|(n, how, port)| format!("{}{n}{port}", ["", "*.", "="][how]))
    }

    fn port() -> impl Strategy<Value = u16> {
        prop_oneof![Just(80u16), Just(443), Just(22), 1u16..]
    }

    proptest! {
        #[test]
        fn canonicalization_is_idempotent(input in prop_oneof![name(), any::<String>(), "[0-9.x]{1,12}"]) {
            if let Ok(h) = canonicalize_host(&input) {
                let again = canonicalize_host(&h.to_string());
                prop_assert_eq!(again.as_ref(), Ok(&h), "{} -> {}", input, h);
                if let Host::Name(n) = &h {
                    prop_assert!(n.len() <= 253 && !n.ends_with('.'));
                    prop_assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'));
                }
            }
        }

        #[test]
        fn a_name_matches_only_itself_or_its_parents(target in name(), entry in name(), how in 0..3usize) {
            let (Ok(Host::Name(t)), Ok(Host::Name(e))) = (canonicalize_host(&target), canonicalize_host(&entry)) else {
                return Ok(());
            };
            let text = format!("{}{e}:*", ["", "*.", "="][how]);
            let p = build(vec![layer(LayerKind::User, &[&text], &[])]);
            let related = t == e || t.ends_with(&format!(".{e}"));
            if p.decide(&Host::Name(t.clone()), 443, &LocalAddrs::none()).is_allowed() {
                prop_assert!(related, "{} matched {}", t, text);
            }
        }

        #[test]
        fn index_agrees_with_the_reference_matcher(
            allows in prop::collection::vec(entry_text(), 1..6),
            blocks in prop::collection::vec(entry_text(), 0..3),
            target in small_name(),
            port in port(),
        ) {
            let allow_refs: Vec<&str> = allows.iter().map(String::as_str).collect();
            let block_refs: Vec<&str> = blocks.iter().map(String::as_str).collect();
            let l = layer(LayerKind::User, &allow_refs, &block_refs);
            let h = canonicalize_host(&target).unwrap();
            let blocked = l.block.iter().any(|e| e.matches(&h, port));
            let allowed = l.allow.iter().any(|e| e.matches(&h, port));
            let p = build(vec![l]);
            let d = p.decide(&h, port, &LocalAddrs::none());
            let want = if blocked { Reason::Blocked } else if allowed { Reason::Allowed } else { Reason::NotAllowed };
            prop_assert_eq!(d.reason, want);
            if let Some(rule) = &d.rule {
                let e = Entry::parse(rule, if blocked { EntryKind::Block } else { EntryKind::Allow }).unwrap();
                prop_assert!(e.matches(&h, port));
            }
        }

        #[test]
        fn any_block_beats_any_allow(
            allows in prop::collection::vec(entry_text(), 1..5),
            block in entry_text(),
            block_layer in 0..3usize,
            blocklist in any::<bool>(),
            target in small_name(),
            port in port(),
        ) {
            let allow_refs: Vec<&str> = allows.iter().map(String::as_str).collect();
            let mut layers = vec![
                layer(LayerKind::Managed, &allow_refs, &[]),
                layer(LayerKind::User, &allow_refs, &[]),
                layer(LayerKind::Repo, &allow_refs, &[]),
            ];
            layers[block_layer].block.push(Entry::parse(&block, EntryKind::Block).unwrap());
            if blocklist { layers[1].mode = Some(Mode::Blocklist); }
            let h = canonicalize_host(&target).unwrap();
            let matches = layers[block_layer].block[0].matches(&h, port);
            let p = build(layers);
            let d = p.decide(&h, port, &LocalAddrs::none());
            if matches {
                prop_assert_eq!(d.reason, Reason::Blocked);
                prop_assert_eq!(d.layer, [LayerKind::Managed, LayerKind::User, LayerKind::Repo][block_layer]);
            }
        }

        #[test]
        fn managed_allow_is_never_widened(
            managed in prop::collection::vec(entry_text(), 1..3),
            user in prop::collection::vec(entry_text(), 1..5),
            repo in prop::collection::vec(entry_text(), 0..5),
            blocklist in any::<bool>(),
            target in small_name(),
            port in port(),
        ) {
            let refs = |v: &Vec<String>| v.to_vec();
            let m: Vec<String> = refs(&managed);
            let m_refs: Vec<&str> = m.iter().map(String::as_str).collect();
            let u_refs: Vec<&str> = user.iter().map(String::as_str).collect();
            let r_refs: Vec<&str> = repo.iter().map(String::as_str).collect();
            let ml = layer(LayerKind::Managed, &m_refs, &[]);
            let h = canonicalize_host(&target).unwrap();
            let managed_ok = ml.allow.iter().any(|e| e.matches(&h, port));
            let mut ul = layer(LayerKind::User, &u_refs, &[]);
            if blocklist { ul.mode = Some(Mode::Blocklist); }
            let p = build(vec![ml, ul, layer(LayerKind::Repo, &r_refs, &[])]);
            if p.decide(&h, port, &LocalAddrs::none()).is_allowed() {
                prop_assert!(managed_ok, "{}:{} allowed past managed {:?}", target, port, managed);
            }
        }

        #[test]
        fn parsers_never_panic_and_entries_round_trip(
            input in prop_oneof![
                any::<String>(),
                "[=*.\\[\\]:/%@a-z0-9.éß-]{0,24}",
                entry_text(),
            ],
        ) {
            let _ = parse_target(&input);
            let _ = parse_authority(&input);
            let _ = canonicalize_host(&input);
            for kind in [EntryKind::Allow, EntryKind::Block] {
                if let Ok(e) = Entry::parse(&input, kind) {
                    let again = Entry::parse(&e.canonical(), kind);
                    prop_assert!(again.is_ok(), "{} -> {}", input, e.canonical());
                    if let Ok(again) = again {
                        prop_assert_eq!(again.canonical(), e.canonical());
                        prop_assert_eq!(again.pattern(), e.pattern());
                    }
                }
            }
        }

        #[test]
        fn ip_index_agrees_with_the_reference_matcher(
            nets in prop::collection::vec((any::<u32>(), 0u8..=32, prop_oneof![Just(""), Just(":443"), Just(":*")]), 1..6),
            block in prop::option::of((any::<u32>(), 0u8..=32)),
            t in any::<u32>(),
            port in port(),
        ) {
            let text = |a: u32, len: u8| ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(a), len).unwrap().trunc().to_string();
            let allows: Vec<String> = nets.iter().map(|(a, l, p)| format!("{}{p}", text(*a, *l))).collect();
            let blocks: Vec<String> = block.iter().map(|(a, l)| text(*a, *l)).collect();
            let allow_refs: Vec<&str> = allows.iter().map(String::as_str).collect();
            let block_refs: Vec<&str> = blocks.iter().map(String::as_str).collect();
            let mut l = layer(LayerKind::User, &allow_refs, &block_refs);
            l.allow_private = vec!["0.0.0.0/0".parse().unwrap()];
            let h = Host::Ip(IpAddr::V4(std::net::Ipv4Addr::from(t)));
            let blocked = l.block.iter().any(|e| e.matches(&h, port));
            let allowed = l.allow.iter().any(|e| e.matches(&h, port));
            let p = build(vec![l]);
            let want = if blocked { Reason::Blocked } else if allowed { Reason::Allowed } else { Reason::IpNotAllowed };
            prop_assert_eq!(p.decide(&h, port, &LocalAddrs::none()).reason, want);
        }

        #[test]
        fn ip_targets_need_allow_and_private(
            a in any::<u32>(), len in 0u8..=32, t in any::<u32>(), private in any::<bool>(), blocklist in any::<bool>(),
        ) {
            let net = ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(a), len).unwrap().trunc();
            let mut l = layer(LayerKind::User, &[&format!("{net}:*")], &[]);
            if private { l.allow_private = vec![IpNet::V4(net)]; }
            if blocklist { l.mode = Some(Mode::Blocklist); }
            let p = build(vec![l]);
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(t));
            for target in [ip, IpAddr::V6(std::net::Ipv4Addr::from(t).to_ipv6_mapped())] {
                let d = p.decide(&Host::Ip(target), 443, &LocalAddrs::none());
                let inside = net.contains(&std::net::Ipv4Addr::from(t));
                let want = if !inside {
                    Reason::IpNotAllowed
                } else if is_special_purpose(ip) && !private {
                    Reason::PrivateAddress
                } else {
                    Reason::Allowed
                };
                prop_assert_eq!(d.reason, want, "{} in {}", target, net);
            }
        }
    }
}
