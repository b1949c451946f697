//! Policy: host canonicalization, target and entry parsing, the special-purpose address table,
//! the label-suffix index and the layered evaluator (DESIGN §4, SECURITY §3).
//!
//! Pure: no I/O, no DNS, no clock. The proxy, the CLI's `policy check` and the daemon all call
//! the same code, so a verdict shown to a user is the verdict the proxy enforces.

use std::fmt;

pub mod addr;
pub mod canon;
pub mod domain;
pub mod entry;
pub mod eval;
mod index;

pub use addr::{effective, embedded_ipv4, is_special_purpose, normalize_net};
pub use canon::{
    Host, MAX_LABEL_LEN, MAX_NAME_LEN, Malformed, MalformedKind, Target, canonicalize_host,
    parse_authority, parse_target,
};
pub use domain::{registrable_domain, same_registrable_domain};
pub use entry::{Entry, EntryError, EntryKind, NameMatch, Pattern, PortSpec};
pub use eval::{
    GateEntry, GateMatch, LocalAddrs, PhaseLists, Policy, PolicyError, PolicyLayer, PolicyWarning,
    ReviewHost, phase_names,
};

use serde::{Deserialize, Serialize};

/// Which configuration layer a rule came from (the audit `layer` field and `X-Airlock-Layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// `/etc/airlock/policy.toml`, the fleet layer.
    Managed,
    /// `~/.airlock/config.toml`.
    User,
    /// The repo's `.airlock.toml`, applied only when trusted.
    Repo,
    /// The standalone proxy's `--config` file.
    Operator,
    /// No rule: a default deny, or an address/SNI refusal.
    None,
}

impl LayerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Managed => "managed",
            Self::User => "user",
            Self::Repo => "repo",
            Self::Operator => "operator",
            Self::None => "none",
        }
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `mode` in `[network]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse anything unlisted; refuse to start on an empty effective list.
    #[default]
    Allowlist,
    /// Permit everything except the named hosts.
    Blocklist,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowlist => "allowlist",
            Self::Blocklist => "blocklist",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

/// The closed list of reason codes shared by `policy check --json`, the `X-Airlock-Reason`
/// header, audit lines and review-plane detection. `docs/audit-format.md` tables them; adding
/// one is a format change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Allowed by an `allow` entry (allowlist mode) or by absence of a block (blocklist mode).
    Allowed,
    /// Allowlist mode and no `allow` entry of user∪repo matches.
    NotAllowed,
    /// A `block` entry matches (any layer).
    Blocked,
    /// The managed layer has `allow` entries and none matches.
    ManagedNotAllowed,
    /// The host is a review-plane server; always refused.
    ReviewPlane,
    /// An IP-literal target with no matching `allow` entry.
    IpNotAllowed,
    /// A special-purpose address (target or resolved answer) outside `allow_private`.
    PrivateAddress,
    /// A resolved answer inside a `block` CIDR.
    BlockedAddress,
    /// TLS SNI names a different host than the CONNECT target.
    SniMismatch,
    /// No SNI where one is required.
    SniMissing,
    /// The request or target could not be parsed (HTTP 400).
    Malformed,
    /// The client closed (or reset) the connection before its request head's final CRLF CRLF
    /// (HTTP 400 is still sent, in case the client only half-closed).
    IncompleteHead,
    /// The session's tunnel cap was reached (HTTP 503).
    TunnelLimit,
    /// The name did not resolve, or resolution timed out (HTTP 502/504).
    ResolveFailed,
    /// No resolved address accepted the connection (HTTP 502/504).
    ConnectFailed,
    /// The journal or audit line could not be written: fail closed (HTTP 503).
    AuditUnavailable,
    /// The tunnel was open when its writer died; settled by a later writer.
    Interrupted,
    /// The session's or the daemon's connection cap was reached (HTTP 503).
    ConnectionLimit,
    /// Too many name resolutions in flight at once (HTTP 503), or the session's
    /// synthetic-address table is full (the resolver answers SERVFAIL).
    DnsLimit,
    /// The session wrote its `[audit] session_budget` of audit bytes and was stopped.
    AuditBudget,
    /// The audit directory's file system fell below `[audit] min_free`: no space, no traffic.
    LowSpace,
    /// A UDP datagram to a non-loopback address from inside the sandbox: only TCP leaves the
    /// sandbox (through the proxy or transparent capture) and DNS goes to its resolver at
    /// 127.0.0.53; the datagram was dropped with ICMP port unreachable.
    UdpRefused,
    /// A gated attempt (`[gate]`) that a person denied (HTTP 403).
    GateDenied,
    /// A gated attempt that no one decided within `[gate] timeout` (HTTP 403).
    GateExpired,
    /// The session already has the most attempts held for a decision (HTTP 503).
    GateLimit,
    /// A gated attempt where no one can decide: the standalone proxy, which keeps no gates
    /// (HTTP 503; fail closed).
    GateUnavailable,
    /// A held attempt that ended undecided: the agent closed the connection, or the session
    /// or daemon stopped.
    GateAbandoned,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::NotAllowed => "not_allowed",
            Self::Blocked => "blocked",
            Self::ManagedNotAllowed => "managed_not_allowed",
            Self::ReviewPlane => "review_plane",
            Self::IpNotAllowed => "ip_not_allowed",
            Self::PrivateAddress => "private_address",
            Self::BlockedAddress => "blocked_address",
            Self::SniMismatch => "sni_mismatch",
            Self::SniMissing => "sni_missing",
            Self::Malformed => "malformed",
            Self::IncompleteHead => "incomplete_head",
            Self::TunnelLimit => "tunnel_limit",
            Self::ResolveFailed => "resolve_failed",
            Self::ConnectFailed => "connect_failed",
            Self::AuditUnavailable => "audit_unavailable",
            Self::Interrupted => "interrupted",
            Self::ConnectionLimit => "connection_limit",
            Self::DnsLimit => "dns_limit",
            Self::AuditBudget => "audit_budget",
            Self::LowSpace => "low_space",
            Self::UdpRefused => "udp_refused",
            Self::GateDenied => "gate_denied",
            Self::GateExpired => "gate_expired",
            Self::GateLimit => "gate_limit",
            Self::GateUnavailable => "gate_unavailable",
            Self::GateAbandoned => "gate_abandoned",
        }
    }

    /// Every code, for docs and tests that check the closed list.
    pub const ALL: &'static [Reason] = &[
        Self::Allowed,
        Self::NotAllowed,
        Self::Blocked,
        Self::ManagedNotAllowed,
        Self::ReviewPlane,
        Self::IpNotAllowed,
        Self::PrivateAddress,
        Self::BlockedAddress,
        Self::SniMismatch,
        Self::SniMissing,
        Self::Malformed,
        Self::IncompleteHead,
        Self::TunnelLimit,
        Self::ResolveFailed,
        Self::ConnectFailed,
        Self::AuditUnavailable,
        Self::Interrupted,
        Self::ConnectionLimit,
        Self::DnsLimit,
        Self::AuditBudget,
        Self::LowSpace,
        Self::UdpRefused,
        Self::GateDenied,
        Self::GateExpired,
        Self::GateLimit,
        Self::GateUnavailable,
        Self::GateAbandoned,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verdict with its provenance: what `policy check` prints and what an audit line records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: Reason,
    /// The entry as written in its file (e.g. `"*.example.com:8443"`), if a rule decided.
    pub rule: Option<String>,
    pub layer: LayerKind,
    /// The deciding layer's file as the user sees it (e.g. `~/.airlock/config.toml`).
    pub policy: Option<String>,
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }

    /// A refusal that no rule decided (address guard, SNI, caps, malformed input).
    pub fn refusal(reason: Reason) -> Self {
        Self { verdict: Verdict::Deny, reason, rule: None, layer: LayerKind::None, policy: None }
    }
}
