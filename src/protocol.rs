//! The control protocol between the CLI (and the host-side supervisor) and `airlockd`, shared by
//! [`crate::client`] and [`crate::daemon`] (DESIGN §6). This module owns the wire format: every
//! type here is a plain serde struct that depends on no other module, so a change to the
//! configuration's in-memory types cannot change what crosses the socket. The conversions to and
//! from configuration types live with them (`config::wire`).
//!
//! Framing: a 4-byte big-endian length, then that many bytes of JSON (one object). The first
//! frame on a connection is always [`Request::Hello`]; its reply names the protocol version both
//! sides then speak (the highest they share; each side speaks N and N-1). `hello` and
//! `quit_if_idle` keep their shape forever so that any two versions can still agree to disagree.
//!
//! Versions:
//! - **1**: the first.
//! - **2**: version 1's messages, plus a [`Capabilities`] set in both `hello`s. What both sides
//!   list is in force for the connection; later additions to version 2 are optional fields and
//!   messages, each behind a capability where an older version-2 peer must not see it, so they
//!   need no further bump. Under version 1 no capability is in force.
//!
//! Every message has the same JSON in both versions (a version-1 peer ignores the `capabilities`
//! field of a `hello`); a receiver ignores fields it does not know.
//!
//! The listener fd of `session_start`/`session_reregister` travels as `SCM_RIGHTS` ancillary data
//! on the first byte of that request's frame. Under the [`SESSION_SOCKETS`] capability several
//! fds travel there, in the order [`SessionSpec::sockets`] names them; without it, one (the
//! proxy listener) and no `sockets` field.
//!
//! Under the [`SESSION_STOP`] capability the daemon may send one unsolicited
//! [`Response::SessionStopped`] on a session's connection, between replies: the session hit an
//! audit bound and its supervisor is to end the sandbox. A client without the capability never
//! sees it (an older client would take it for the reply to its `session_end`).
//!
//! Under the [`GATES`] capability a control connection that owns no session may list the pending
//! action gates ([`Request::GateList`], optionally waiting for a change) and decide one
//! ([`Request::GateDecide`]); the daemon answers [`Response::Gates`] and
//! [`Response::GateDecided`].
//!
//! Under the [`PHASES`] capability a session may start in a phase ([`SessionSpec::phase`]) and
//! any control connection (all are host side: the socket refuses sandbox peers) may switch a
//! running session's phase ([`Request::PhaseSet`], answered by [`Response::PhaseSet`]); `status` then names each
//! session's phase and the phases its layers define. The session's own connection is then told
//! of each switch with an unsolicited [`Response::PhaseChanged`] between replies, so its
//! supervisor re-registers in the phase in force.
//!
//! Under the [`SESSION_INBOUND`] capability the supervisor may send [`Request::SessionInbound`]
//! on its session's connection, one per closed `--port` connection; the daemon writes the
//! `inbound` audit line and always answers [`Response::InboundRecorded`] (never `error`, which
//! a supervisor waiting for `session_ended` would take for its answer).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The newest protocol this build speaks.
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest protocol this build still speaks (N-1).
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// The first version whose `hello` carries [`Capabilities`].
pub const CAPABILITIES_SINCE: u32 = 2;
/// The largest frame either side accepts (layers are small; this bounds a hostile peer).
pub const MAX_FRAME: usize = 4 << 20;

/// A range of protocol versions one side speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRange {
    pub min: u32,
    pub max: u32,
}

impl VersionRange {
    pub const CURRENT: Self = Self { min: MIN_PROTOCOL_VERSION, max: PROTOCOL_VERSION };

    /// The highest version both ranges contain.
    pub fn shared(self, other: Self) -> Option<u32> {
        let hi = self.max.min(other.max);
        let lo = self.min.max(other.min);
        (hi >= lo).then_some(hi)
    }

    /// This build's range; with `test-hooks`, `var` (`MIN-MAX`) may replace it so tests can
    /// play an older or newer peer.
    pub fn from_test_override(var: Option<String>) -> Self {
        #[cfg(feature = "test-hooks")]
        if let Some((lo, hi)) = var.as_deref().and_then(|v| v.split_once('-'))
            && let (Ok(min), Ok(max)) = (lo.parse(), hi.parse())
        {
            return Self { min, max };
        }
        let _ = var;
        Self::CURRENT
    }
}

impl std::fmt::Display for VersionRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.max)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// Optional features a version-2 peer offers in its `hello` (names in `snake_case`). The set in
/// force on a connection is [`Capabilities::agreed`]: what both sides offer, and nothing under
/// version 1. A name a side does not know is simply not shared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Capabilities(BTreeSet<String>);

impl Capabilities {
    /// What this build offers.
    pub fn current() -> Self {
        [
            SESSION_SOCKETS,
            CAPTURE_TCP6,
            CAPTURE_UDP_LOG,
            SESSION_STOP,
            SESSION_INBOUND,
            LAYER_DIGESTS,
            GATES,
            GATE_RELAY,
            PHASES,
            CONTAINER_SESSIONS,
        ]
        .into_iter()
        .collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The set in force on a connection that agreed on `version`: the names both offer, or
    /// none when there is no version or it predates capabilities.
    pub fn agreed(version: Option<u32>, ours: &Self, theirs: &Self) -> Self {
        match version {
            Some(v) if v >= CAPABILITIES_SINCE => {
                Self(ours.0.intersection(&theirs.0).cloned().collect())
            }
            _ => Self::default(),
        }
    }
}

impl<S: Into<String>> FromIterator<S> for Capabilities {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        Self(iter.into_iter().map(Into::into).collect())
    }
}

/// Capability `session_sockets`: `session_start`/`session_reregister` may carry several sockets,
/// named in order by [`SessionSpec::sockets`] (`proxy`, `dns_udp`, `dns_tcp`, `capture_tcp`;
/// `capture_tcp6` and `capture_udp_log` under their own capabilities).
/// Without it exactly one fd travels, the proxy listener: a daemon that predates it would take
/// any other fd for the proxy.
pub const SESSION_SOCKETS: &str = "session_sockets";

/// Capability `capture_tcp6` (with [`SESSION_SOCKETS`]): the `sockets` list may name
/// `capture_tcp6`, the sandbox's IPv6 capture listener, after `capture_tcp`. Without it the
/// client leaves that socket out: a daemon that predates it would refuse the session for the
/// unknown kind.
pub const CAPTURE_TCP6: &str = "capture_tcp6";

/// Capability `capture_udp_log` (with [`SESSION_SOCKETS`]): the `sockets` list may name
/// `capture_udp_log`, the sandbox's netfilter log socket, last. Without it the client leaves
/// that socket out: a daemon that predates it would refuse the session for the unknown kind.
/// The sandbox's refusal rule is in force either way (UDP other than DNS is refused); only the
/// `udp_refused` lines are missing.
pub const CAPTURE_UDP_LOG: &str = "capture_udp_log";

/// Capability `session_stop`: the daemon may send [`Response::SessionStopped`] on a session's
/// connection when `[audit] session_budget` or `[audit] min_free` stops the session. Without
/// it the stopped session keeps running with every attempt refused (`503`) until it ends.
pub const SESSION_STOP: &str = "session_stop";

/// Capability `layer_digests`: `session_start`/`session_reregister` may name the user and repo
/// layers by content ([`PolicyLayers::sources`]) instead of sending parsed documents: a source
/// without `text` refers to a layer the daemon parsed before; one the daemon does not hold is
/// refused with [`ErrorCode::UnknownLayer`] and the client resends the request with every
/// source's `text`. The daemon keys what it holds by the SHA-256 it computes itself over the
/// text, so a changed file is a new key and is never served from an older parse.
pub const LAYER_DIGESTS: &str = "layer_digests";

/// Capability `session_inbound`: the supervisor may send [`Request::SessionInbound`] (one per
/// connection through a `--port`), answered by [`Response::InboundRecorded`]. Without it the
/// CLI refuses `--port`: an older daemon would not audit the connections.
pub const SESSION_INBOUND: &str = "session_inbound";

/// Capability `gates`: [`Request::GateList`] and [`Request::GateDecide`] (issue 18, action
/// gates). Without it `airlock gate` says the daemon is too old to hold gates; an older daemon
/// never holds an attempt either, since it does not know `[gate]`.
pub const GATES: &str = "gates";

/// Capability `gate_relay` (with [`GATES`]): a session may be registered with
/// [`SessionSpec::gate_relay`], whose gates are then decided on the review server only: the
/// daemon takes a decision on them only with the relay key's [`RelayedDecision`], which the
/// session's own supervisor holds and sends once the server decided. Without it the CLI
/// refuses a gated session of a user logged in to a review server (an older daemon would let
/// `airlock gate approve` decide locally, past the server's rules).
pub const GATE_RELAY: &str = "gate_relay";

/// Capability `phases`: [`SessionSpec::phase`] starts a session in a phase, and
/// [`Request::PhaseSet`] switches a running one (issue 20). Without it the CLI refuses
/// `--phase` and `airlock phase set`: an older daemon would ignore the phase.
pub const PHASES: &str = "phases";

/// Capability `container_sessions`: a session may be registered with
/// [`SessionSpec::container`] and no socket: its proxy runs in a container of its own
/// (`--backend docker|podman`, docs/backends.md) and writes the audit lines itself; the daemon
/// writes the session's start and end records (with its `audit_root`) as for any session.
/// Without it the CLI refuses `--backend docker|podman` (an older daemon would ask for the
/// listener).
pub const CONTAINER_SESSIONS: &str = "container_sessions";

/// Test hook (feature `test-hooks`): the daemon's protocol range, `MIN-MAX`.
pub const TEST_DAEMON_PROTOCOL_VAR: &str = "AIRLOCK_TEST_DAEMON_PROTOCOL";
/// Test hook (feature `test-hooks`): the client's protocol range, `MIN-MAX`.
pub const TEST_CLIENT_PROTOCOL_VAR: &str = "AIRLOCK_TEST_CLIENT_PROTOCOL";
/// Test hook (feature `test-hooks`): the version string the daemon reports.
pub const TEST_DAEMON_VERSION_VAR: &str = "AIRLOCK_TEST_DAEMON_VERSION";

/// Client → daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Always first. Stable forever (`capabilities`, since version 2, is optional).
    Hello {
        protocol: VersionRange,
        client_version: String,
        #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
        capabilities: Capabilities,
    },
    /// What the daemon is doing.
    Status,
    /// Registers a new session and hands over its proxy listener (one fd, SCM_RIGHTS). The
    /// connection then belongs to the session: closing it without `session_end` ends the
    /// session with `end_reason: "supervisor_lost"`.
    SessionStart(Box<SessionSpec>),
    /// Re-registers a running session with a new daemon instance after the old one died
    /// (same `session` id, a dup of the same listener); `seq` restarts under the new `boot`.
    SessionReregister(Box<SessionSpec>),
    /// Ends the session owned by this connection.
    SessionEnd(SessionEnd),
    /// Version skew only: asks an older daemon to exit if it is idle. Stable forever.
    QuitIfIdle,
    /// Under [`SESSION_INBOUND`]: one connection through a `--port` is over; the daemon
    /// writes its `inbound` audit line.
    SessionInbound(InboundRecord),
    /// Under [`GATES`]: the pending gates. With `after` (a [`Response::Gates`] `version`), the
    /// daemon answers once the book changed past it or after `wait_ms` (at most
    /// [`MAX_GATE_WAIT_MS`]), whichever is first.
    GateList {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Under [`GATES`]: approve or deny one pending gate.
    GateDecide(GateDecision),
    /// Under [`PHASES`]: put session `session` in phase `phase` (`None`: the plain
    /// `[network]` lists), built from the layers the session started with.
    PhaseSet {
        session: String,
        #[serde(default)]
        phase: Option<String>,
    },
}

/// The longest a [`Request::GateList`] waits for a change.
pub const MAX_GATE_WAIT_MS: u64 = 60_000;

/// One gate as the daemon holds it: who asked, for what exactly (the canonical action and its
/// digest), how it was configured and until when it waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateInfo {
    pub id: String,
    /// `egress` (a held connection or plain-HTTP request).
    pub kind: String,
    pub session: String,
    pub repo: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// `CONNECT` or the plain-HTTP method.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// Plain HTTP: the request line as the agent sent it (method, absolute URL, version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The canonical action text the digest is taken over (one JSON object, sorted keys).
    pub action: String,
    /// `sha256:<hex>` of `action`: what a decision is bound to.
    pub digest: String,
    /// `low`, `medium` or `high`.
    pub severity: String,
    /// The `[gate]` entry that matched, as written.
    pub rule: String,
    /// Its layer (`managed`, `user`, `repo`, `operator`) and file.
    pub layer: String,
    pub policy: String,
    /// RFC 3339 UTC with milliseconds.
    pub requested_at: String,
    /// When it expires unless decided (RFC 3339 UTC with milliseconds).
    pub deadline: String,
    /// Under [`GATE_RELAY`]: the review server that decides this session's gates (local
    /// decisions are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
}

/// A decision on one pending gate, bound to the digest the decider saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDecision {
    pub id: String,
    /// The `digest` of the [`GateInfo`] decided; another digest is refused (the action is not
    /// the one the decider saw).
    pub digest: String,
    pub approve: bool,
    #[serde(default)]
    pub note: String,
    /// Who decides (their email, or their local user name without a login).
    pub by: String,
    /// Under [`GATE_RELAY`]: the review server's decision, relayed by the session's own
    /// supervisor; the only kind of decision a relayed session's gate takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayedDecision>,
}

/// A decision the review server made, as the supervisor relays it to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayedDecision {
    /// The session's relay key (its SHA-256 is [`GateRelaySpec::key_sha256`]).
    pub key: String,
    /// The server's id of the gate (`gt_…`), recorded on the audit line.
    pub server_gate: String,
    /// The server marked the decision a self-decision.
    #[serde(rename = "self", default)]
    pub self_decided: bool,
    /// Nobody could decide: the server was unreachable or refused the gate (the note says
    /// why). The attempt is refused `gate_unavailable`; `approve` is ignored.
    #[serde(default)]
    pub unavailable: bool,
}

/// Under [`GATE_RELAY`]: this session's gates are decided on a review server.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRelaySpec {
    /// The server (for messages and `airlock gate list`).
    pub server: String,
    /// Lowercase hex SHA-256 of the relay key the supervisor keeps.
    pub key_sha256: String,
}

impl std::fmt::Debug for GateRelaySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateRelaySpec").field("server", &self.server).finish_non_exhaustive()
    }
}

/// What a decision made of a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateState {
    Approved,
    Denied,
}

impl GateState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Denied => "denied",
        }
    }
}

/// One inbound connection through a `--port`, as the supervisor saw it (the `inbound` audit
/// line of docs/audit-format.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundRecord {
    pub session: String,
    /// When the connection was accepted, RFC 3339 UTC with milliseconds.
    pub ts: String,
    /// The host-side client, `ip:port`.
    pub peer: String,
    /// The host address it connected to, `ip:port`.
    pub listen: String,
    /// The sandbox port (on `127.0.0.1` inside).
    pub port: u16,
    pub bytes_to_sandbox: u64,
    pub bytes_from_sandbox: u64,
    pub duration_ms: u64,
    /// Set when the connection never reached the server inside: the audit reason code
    /// (`connect_failed`, `connection_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Why, for the supervisor's own log (not written to the audit line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Daemon → client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    /// `version` is the protocol both sides now speak; `None` when they share none (the client
    /// may then send only `quit_if_idle`). `capabilities` (since version 2) are those in force:
    /// [`Capabilities::agreed`]. Stable forever.
    Hello {
        version: Option<u32>,
        protocol: VersionRange,
        daemon_version: String,
        pid: u32,
        boot: String,
        sessions: usize,
        #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
        capabilities: Capabilities,
    },
    Status(Box<StatusReply>),
    SessionStarted {
        session: String,
        boot: String,
        listen: String,
    },
    SessionEnded {
        session: String,
    },
    /// Unsolicited, under [`SESSION_STOP`] only, at most once per session: the daemon stopped
    /// the session (its final audit line is written) and refuses all its traffic; the
    /// supervisor ends the sandbox, tells the user `message` and then sends `session_end`.
    SessionStopped {
        session: String,
        /// The audit reason code: `audit_budget` or `low_space`.
        reason: String,
        /// What happened and what to do, for the user's terminal.
        message: String,
    },
    /// Reply to `session_inbound` (capability [`SESSION_INBOUND`]): whether the line was
    /// written, and if not why.
    InboundRecorded {
        session: String,
        written: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Reply to `gate_list` (capability [`GATES`]): the pending gates, oldest first, and the
    /// book's version (pass it as `after` to wait for the next change).
    Gates {
        version: u64,
        gates: Vec<GateInfo>,
    },
    /// Reply to `gate_decide`: the gate was decided and its held attempt told.
    GateDecided {
        id: String,
        state: GateState,
        /// The decider is the requester (always so without a review server).
        #[serde(rename = "self")]
        self_decided: bool,
    },
    /// Unsolicited, under [`PHASES`] only, on a session's own connection between replies: the
    /// session's phase was switched (`phase_set` from another connection). The supervisor
    /// keeps it, so a re-registration after a daemon restart resumes in that phase.
    PhaseChanged {
        session: String,
        phase: Option<String>,
    },
    /// Reply to `phase_set` (capability [`PHASES`]): the switch is in force and its audit
    /// line (`seq`) written.
    PhaseSet {
        session: String,
        phase: Option<String>,
        previous: Option<String>,
        seq: u64,
    },
    /// Reply to `quit_if_idle`; stable forever.
    QuitIfIdle {
        quitting: bool,
        sessions: usize,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Machine-readable error kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The peer runs as another uid.
    PeerUid,
    /// The peer runs in another user or network namespace than the daemon (SECURITY §7), or
    /// its namespaces could not be determined.
    PeerNamespace,
    /// A request before `hello`, after a failed `hello`, or not valid JSON.
    Protocol,
    /// The daemon's configuration (e.g. the managed layer) is broken; the message says how.
    Config,
    /// The listener fd is missing or failed validation (SECURITY §4).
    Listener,
    /// Unknown session, a second session on one connection, a duplicate id.
    Session,
    /// The daemon is stopping; retry with the next instance.
    Stopping,
    /// Under [`LAYER_DIGESTS`]: a layer source without text names a digest the daemon does not
    /// hold (it restarted, or evicted it); resend the request with every source's text.
    UnknownLayer,
    /// Under [`GATES`]: no pending gate has that id (decided, expired or abandoned already).
    UnknownGate,
    /// Under [`GATES`]: the decision names another digest than the pending gate's.
    GateDigest,
    /// Under [`GATE_RELAY`]: the gate's session is decided on a review server; a local
    /// decision (or a relayed one without the session's key) is refused.
    GateRelayed,
    /// Under [`PHASES`]: the phase asked for is not defined by the session's layers, or its
    /// allowlist is empty; the message says which phases there are.
    Phase,
    /// Anything else on the daemon's side.
    Internal,
}

/// Who runs the session (`~/.airlock/identity.toml`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// Everything the supervisor tells the daemon about a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// Required for `session_reregister`; for `session_start`, `None` lets the daemon choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The repo name (audit `repo`).
    pub repo: String,
    /// The repo's host path (audit `repo_path`).
    pub repo_path: String,
    /// The user layer and the *trusted* repo layer as separate parsed documents (each with its
    /// display name and digest) plus the review-plane servers the daemon cannot read itself.
    /// The daemon adds the managed layer it reads itself (DESIGN §4).
    #[serde(default)]
    pub config: PolicyLayers,
    #[serde(default)]
    pub identity: IdentityInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The airlock version of the supervisor.
    #[serde(default)]
    pub airlock_version: String,
    #[serde(default)]
    pub command: Vec<String>,
    /// Sandbox layers in force (`landlock_fs`, `seccomp`, …) for the session record.
    #[serde(default)]
    pub layers: Vec<String>,
    /// The supervisor's pid, shown by `airlock status`.
    #[serde(default)]
    pub supervisor_pid: u32,
    /// Under [`SESSION_SOCKETS`] only: the kinds of the attached fds, in order (`proxy` first,
    /// then any of `dns_udp`, `dns_tcp`, `capture_tcp`, `capture_tcp6` under [`CAPTURE_TCP6`],
    /// `capture_udp_log` under [`CAPTURE_UDP_LOG`]). Empty = the proxy listener alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sockets: Vec<String>,
    /// Under [`GATE_RELAY`]: decide this session's gates on a review server only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_relay: Option<GateRelaySpec>,
    /// Under [`PHASES`]: the phase the session starts in (`airlock run --phase`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Under [`CONTAINER_SESSIONS`]: the session's proxy is this container; no socket travels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerSpec>,
}

/// A container session's proxy (`--backend docker|podman`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// `docker` or `podman`.
    pub engine: String,
    /// The proxy container's name (`airlock-proxy-<name>-<key8>-<session8>`).
    pub proxy: String,
}

/// `session_start`'s policy layers: what the client read and trusts, as documents (DESIGN §4).
/// `user` and `repo` are sent as `null` when absent and `review_servers` always, because a
/// version-1 daemon requires the key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyLayers {
    #[serde(default)]
    pub user: Option<LayerDoc>,
    #[serde(default)]
    pub repo: Option<LayerDoc>,
    /// Review-plane servers from files the daemon cannot read (the user layer's
    /// `[review] servers`, the identity's `server`); always blocked.
    #[serde(default)]
    pub review_servers: Vec<ReviewServer>,
    /// Under [`LAYER_DIGESTS`] only: the user and repo layers by content (then `user` and
    /// `repo` are `null`). Empty: the documents above are the layers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<LayerSource>,
}

/// One layer file by content (capability [`LAYER_DIGESTS`]): which layer, the file as the user
/// sees it, the lowercase hex SHA-256 of its bytes, and (when the daemon may not hold it) the
/// file's text. The daemon parses the text itself, as the client did.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSource {
    pub kind: LayerKind,
    pub name: String,
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl std::fmt::Debug for LayerSource {
    // The text may hold literal `[mcp]` credentials: never in logs or panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerSource")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("text_bytes", &self.text.as_ref().map(String::len))
            .finish()
    }
}

/// Which configuration layer a document or rule belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    Managed,
    User,
    Repo,
    Operator,
    None,
}

/// One configuration file's content, entries as written (the daemon validates them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDoc {
    pub kind: LayerKind,
    /// The file as the user sees it (`~/.airlock/config.toml`).
    pub name: String,
    /// Lowercase hex SHA-256 of the file's bytes.
    pub digest: String,
    #[serde(default)]
    pub network: NetworkDoc,
    /// `[env] pass`.
    #[serde(default)]
    pub env_pass: Vec<String>,
    /// `[mcp.<server>]`: credential variables per MCP server.
    #[serde(default)]
    pub mcp: BTreeMap<String, BTreeMap<String, Credential>>,
    /// `[review] servers`.
    #[serde(default)]
    pub review_servers: Vec<String>,
    #[serde(default)]
    pub terminal: TerminalDoc,
    /// `[audit]` (managed and user layers only); omitted when the file is silent, so older
    /// daemons and clients see the same documents as before.
    #[serde(default, skip_serializing_if = "AuditDoc::is_empty")]
    pub audit: AuditDoc,
    /// `[logs]` (managed and user layers only); omitted when the file is silent.
    #[serde(default, skip_serializing_if = "LogsDoc::is_empty")]
    pub logs: LogsDoc,
    /// `[gate]`; omitted when the file is silent. A daemon without [`GATES`] would ignore it,
    /// so the client refuses to send gates to such a daemon (fail closed).
    #[serde(default, skip_serializing_if = "GateDoc::is_empty")]
    pub gate: GateDoc,
    /// `[phase.NAME.network]`, by name; omitted when the file defines none. A daemon without
    /// [`PHASES`] ignores it, which is harmless: it then never enters a phase (the client
    /// refuses `--phase` and `phase set` with such a daemon).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases: BTreeMap<String, PhaseDoc>,
}

/// One `[phase.NAME.network]` block, entries as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDoc {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub block: Vec<String>,
}

/// `[gate]`: gated targets in the `allow` entry syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDoc {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<GateRuleDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

impl GateDoc {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One `[[gate.rule]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRuleDoc {
    pub host: String,
    /// `low`, `medium` or `high`.
    pub severity: String,
}

/// `[logs]`: log retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsDoc {
    /// `keep`, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_secs: Option<u64>,
}

impl LogsDoc {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `[audit]`: the session's audit-volume bounds (sizes in bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_budget: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_free: Option<u64>,
}

impl AuditDoc {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `[network]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkDoc {
    #[serde(default)]
    pub mode: Option<NetworkMode>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub block: Vec<String>,
    /// CIDRs (`127.0.0.2/32`).
    #[serde(default)]
    pub allow_private: Vec<String>,
}

/// `mode` in `[network]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Allowlist,
    Blocklist,
}

/// `[terminal]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalDoc {
    #[serde(default)]
    pub clipboard: Option<Clipboard>,
}

/// `clipboard` in `[terminal]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clipboard {
    Deny,
    Allow,
}

/// One `[mcp.<server>]` credential: a literal value or the name of a host variable to copy.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Credential {
    FromEnv { from_env: String },
    Value(String),
}

impl std::fmt::Debug for Credential {
    // Literal credentials are secrets: never in logs or panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::FromEnv { from_env } => {
                f.debug_struct("FromEnv").field("from_env", from_env).finish()
            }
            Self::Value(_) => f.write_str("Value(<redacted>)"),
        }
    }
}

/// A review-plane server, with where it was configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewServer {
    /// As written (URL or host).
    pub server: String,
    pub layer: LayerKind,
    /// The file it came from, as the user sees it.
    pub policy: String,
}

/// A transcript file the session changed, hashed at session end (SECURITY §1). `file` and
/// `bytes` are newer than `path` and `sha256`: records written before them still parse
/// (empty `file`, `bytes` 0), and the review server then matches by `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptHash {
    /// The host path.
    pub path: String,
    /// The path relative to the agent home (`.claude/projects/-work-repo/abc.jsonl`), as
    /// `airlock publish` names the file in its envelopes.
    #[serde(default)]
    pub file: String,
    /// The size of the prefix hashed: the file's size when it was opened at session end, so
    /// lines the agent appends meanwhile are in neither `bytes` nor `sha256`. 0 when skipped.
    #[serde(default)]
    pub bytes: u64,
    /// `sha256:<hex>` of the first `bytes` bytes (or `skipped:too-large` / `skipped:unreadable`).
    pub sha256: String,
}

/// Something the end-of-session sweep took out of the way (SECURITY §7). `why`, `how` and
/// `keys` are optional so that older peers still parse it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    pub path: String,
    /// Where its content is now (empty when nowhere: see `how`).
    pub moved_to: String,
    /// `created`, `replaced`, `changed`, `new git pointer`, `code-running keys`, ….
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// `moved`, `copied`, `renamed_in_tree`, `emptied`, `held_keys` or `failed`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub how: String,
    /// For `held_keys`: the keys held back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// A symlink in the repo whose target lies outside it (never followed by the host side).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideSymlink {
    pub path: String,
    pub target: String,
}

/// The rest of what the end-of-session sweep found, for the end record (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leftovers {
    /// Files and directories whose S_ISUID/S_ISGID bits were stripped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setuid_stripped: Vec<String>,
    /// Symlinks pointing outside the repo (the first 1000; `outside_symlinks_total` counts all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_symlinks: Vec<OutsideSymlink>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outside_symlinks_total: u64,
    /// Agent instruction files (`CLAUDE.md`, `AGENTS.md`, …) the session changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instructions_changed: Vec<String>,
    /// Directories the sweep could not look into (not the caller's, so not the agent's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unscanned: Vec<String>,
    /// Entries the sweep looked at.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub scanned_entries: u64,
    /// `airlock run`: the transcript walk stopped early (too many entries, or too deep), so
    /// `transcripts` may be incomplete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transcripts_truncated: bool,
    /// With `transcripts_truncated`: the directory entries the walk looked at.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transcript_entries_walked: u64,
    /// With `transcripts_truncated`: changed transcripts found but left out of `transcripts`
    /// (the list is kept small enough for one control frame).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transcripts_unlisted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `session_end`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    pub session: String,
    /// The child's exit status as `airlock exec` reports it (128+N for signal N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    #[serde(default)]
    pub transcripts: Vec<TranscriptHash>,
    #[serde(default)]
    pub quarantined: Vec<Quarantined>,
    #[serde(default, flatten)]
    pub leftovers: Leftovers,
    /// A container session that its proxy container stopped (`audit_budget`, `low_space`):
    /// the daemon does not serve that proxy, so the CLI says why. Read for container sessions
    /// only; an older daemon ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReply {
    pub daemon_version: String,
    pub protocol: u32,
    pub binary: String,
    pub pid: u32,
    pub boot: String,
    pub started_at: String,
    pub uptime_ms: u64,
    pub idle_timeout_ms: u64,
    /// `systemd` or `launchd` (the one-shot activator and the test harness speak systemd's).
    pub activation: String,
    pub tunnels: u64,
    pub sessions: Vec<SessionStatus>,
    /// Set when the daemon's own configuration is broken; sessions are refused until fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
}

/// One session in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: String,
    pub repo: String,
    pub repo_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub started_at: String,
    pub listen: String,
    pub tunnels: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    /// False while the proxy is not serving the listener (see the daemon log).
    pub serving: bool,
    /// Under [`PHASES`]: the phase in force (absent: the plain `[network]` lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Under [`PHASES`]: the phases the session's layers define.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("control frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed control message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the control connection")]
    Closed,
}

/// Serializes `msg` as one frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; 4];
    serde_json::to_writer(&mut out, msg)?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    // Cannot truncate: len <= MAX_FRAME < u32::MAX.
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Accumulates bytes from a stream and cuts complete frames out of them.
#[derive(Debug, Default)]
pub struct FrameBuf {
    buf: Vec<u8>,
}

impl FrameBuf {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// True when bytes of an incomplete frame are buffered.
    pub fn is_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next complete frame's JSON, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(head) = self.buf.get(..4) else { return Ok(None) };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame = self.buf[4..4 + len].to_vec();
        self.buf.drain(..4 + len);
        Ok(Some(frame))
    }

    /// The next complete frame decoded as `T`.
    pub fn next_message<T: for<'de> Deserialize<'de>>(&mut self) -> Result<Option<T>, FrameError> {
        match self.next_frame()? {
            Some(frame) => Ok(Some(serde_json::from_slice(&frame)?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn version_negotiation_picks_the_highest_shared() {
        let r = |min, max| VersionRange { min, max };
        assert_eq!(r(1, 2).shared(r(2, 3)), Some(2));
        assert_eq!(r(2, 3).shared(r(1, 2)), Some(2));
        assert_eq!(r(1, 1).shared(r(1, 1)), Some(1));
        assert_eq!(r(1, 2).shared(r(3, 4)), None);
        assert_eq!(r(3, 4).shared(r(1, 2)), None);
    }

    /// A `session_start` exactly as the version-1 build (airlock 0.1.0) encoded it.
    const V1_SESSION_START: &str = r#"{"op":"session_start","repo":"app","repo_path":"/src/app","config":{"user":{"kind":"user","name":"~/.airlock/config.toml","digest":"a648298a62cb5b73a2d2e5e8befd54e4ee2d13fb8b03c80ef66ed0bd84f04fe4","network":{"mode":"allowlist","allow":["api.anthropic.com","git.corp:22"],"block":["pastebin.com"],"allow_private":["127.0.0.2/32"]},"env_pass":["RUST_LOG"],"mcp":{"github":{"GITHUB_TOKEN":{"from_env":"GITHUB_TOKEN"},"LIT":"s3cret"}},"review_servers":["https://review.corp.example"],"terminal":{"clipboard":"allow"}},"repo":null,"review_servers":[{"server":"https://review.corp.example","layer":"user","policy":"~/.airlock/config.toml"}]},"identity":{"email":"a@b.c"},"agent":"claude","airlock_version":"0.1.0","command":["claude"],"layers":["seccomp"],"supervisor_pid":42}"#;
    /// An empty `session_start` as the version-1 build encoded it (its daemon requires
    /// `config.review_servers`).
    const V1_EMPTY_SESSION_START: &str = r#"{"op":"session_start","repo":"","repo_path":"","config":{"user":null,"repo":null,"review_servers":[]},"identity":{},"airlock_version":"","command":[],"layers":[],"supervisor_pid":0}"#;
    #[test]
    fn session_inbound_and_its_answer_have_the_documented_shape() {
        let rec = InboundRecord {
            session: "s".into(),
            ts: "2026-07-24T18:03:11.482Z".into(),
            peer: "127.0.0.7:5000".into(),
            listen: "127.0.0.7:3000".into(),
            port: 3000,
            bytes_to_sandbox: 1,
            bytes_from_sandbox: 2,
            duration_ms: 3,
            refused: None,
            error: None,
        };
        let json = serde_json::to_string(&Request::SessionInbound(rec.clone())).unwrap();
        assert_eq!(
            json,
            r#"{"op":"session_inbound","session":"s","ts":"2026-07-24T18:03:11.482Z","peer":"127.0.0.7:5000","listen":"127.0.0.7:3000","port":3000,"bytes_to_sandbox":1,"bytes_from_sandbox":2,"duration_ms":3}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), Request::SessionInbound(rec));
        let reply = Response::InboundRecorded { session: "s".into(), written: true, error: None };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"reply":"inbound_recorded","session":"s","written":true}"#
        );
        assert!(Capabilities::current().contains(SESSION_INBOUND));
    }

    const V1_HELLO: &str =
        r#"{"op":"hello","protocol":{"min":1,"max":1},"client_version":"0.1.0"}"#;
    const V1_HELLO_REPLY: &str = r#"{"reply":"hello","version":1,"protocol":{"min":1,"max":1},"daemon_version":"0.1.0","pid":7,"boot":"b","sessions":0}"#;

    fn v1_spec() -> SessionSpec {
        let mut mcp = BTreeMap::new();
        mcp.insert(
            "github".to_owned(),
            BTreeMap::from([
                (
                    "GITHUB_TOKEN".to_owned(),
                    Credential::FromEnv { from_env: "GITHUB_TOKEN".into() },
                ),
                ("LIT".to_owned(), Credential::Value("s3cret".into())),
            ]),
        );
        let user = LayerDoc {
            kind: LayerKind::User,
            name: "~/.airlock/config.toml".into(),
            digest: "a648298a62cb5b73a2d2e5e8befd54e4ee2d13fb8b03c80ef66ed0bd84f04fe4".into(),
            network: NetworkDoc {
                mode: Some(NetworkMode::Allowlist),
                allow: vec!["api.anthropic.com".into(), "git.corp:22".into()],
                block: vec!["pastebin.com".into()],
                allow_private: vec!["127.0.0.2/32".into()],
            },
            env_pass: vec!["RUST_LOG".into()],
            mcp,
            review_servers: vec!["https://review.corp.example".into()],
            terminal: TerminalDoc { clipboard: Some(Clipboard::Allow) },
            audit: AuditDoc::default(),
            logs: LogsDoc::default(),
            gate: GateDoc::default(),
            phases: BTreeMap::new(),
        };
        SessionSpec {
            session: None,
            repo: "app".into(),
            repo_path: "/src/app".into(),
            config: PolicyLayers {
                user: Some(user),
                repo: None,
                review_servers: vec![ReviewServer {
                    server: "https://review.corp.example".into(),
                    layer: LayerKind::User,
                    policy: "~/.airlock/config.toml".into(),
                }],
                sources: vec![],
            },
            identity: IdentityInfo { email: Some("a@b.c".into()), ..Default::default() },
            agent: Some("claude".into()),
            agent_version: None,
            airlock_version: "0.1.0".into(),
            command: vec!["claude".into()],
            layers: vec!["seccomp".into()],
            supervisor_pid: 42,
            sockets: vec![],
            gate_relay: None,
            phase: None,
            container: None,
        }
    }

    #[test]
    fn a_version_1_session_start_is_accepted_as_it_was_sent() {
        let req: Request = serde_json::from_str(V1_SESSION_START).unwrap();
        assert_eq!(req, Request::SessionStart(Box::new(v1_spec())));
    }

    #[test]
    fn session_start_is_produced_byte_for_byte_in_the_version_1_form() {
        // A version-1 daemon decodes exactly what it used to receive.
        let req = Request::SessionStart(Box::new(v1_spec()));
        assert_eq!(serde_json::to_string(&req).unwrap(), V1_SESSION_START);
        let empty = Request::SessionStart(Box::default());
        assert_eq!(serde_json::to_string(&empty).unwrap(), V1_EMPTY_SESSION_START);
    }

    #[test]
    fn hellos_of_both_versions_interoperate() {
        // A version-1 CLI's hello, read by this daemon: no capabilities.
        let Request::Hello { protocol, capabilities, .. } = serde_json::from_str(V1_HELLO).unwrap()
        else {
            panic!("not a hello")
        };
        assert_eq!(protocol, VersionRange { min: 1, max: 1 });
        assert!(capabilities.is_empty());
        // This CLI's hello to a version-1 daemon: without capabilities it is byte-for-byte v1's.
        let ours = Request::Hello {
            protocol: VersionRange { min: 1, max: 1 },
            client_version: "0.1.0".into(),
            capabilities: Capabilities::default(),
        };
        assert_eq!(serde_json::to_string(&ours).unwrap(), V1_HELLO);
        // A version-1 daemon's reply, read by this CLI.
        let Response::Hello { version, capabilities, .. } =
            serde_json::from_str(V1_HELLO_REPLY).unwrap()
        else {
            panic!("not a hello reply")
        };
        assert_eq!(version, Some(1));
        assert!(capabilities.is_empty());
        // A version-2 hello carries its capabilities and round-trips.
        let v2 = Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "0.2.0".into(),
            capabilities: ["digest_exchange"].into_iter().collect(),
        };
        let json = serde_json::to_string(&v2).unwrap();
        assert_eq!(
            json,
            r#"{"op":"hello","protocol":{"min":1,"max":2},"client_version":"0.2.0","capabilities":["digest_exchange"]}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), v2);
    }

    #[test]
    fn capabilities_are_in_force_only_when_both_offer_them_under_version_2() {
        let ours: Capabilities = ["digest_exchange", "only_ours"].into_iter().collect();
        let theirs: Capabilities = ["digest_exchange", "only_theirs"].into_iter().collect();
        let v2 = Capabilities::agreed(Some(2), &ours, &theirs);
        assert_eq!(v2, ["digest_exchange"].into_iter().collect());
        assert!(v2.contains("digest_exchange") && !v2.contains("only_ours"));
        // Version 1 has no capabilities, whatever a peer lists.
        assert!(Capabilities::agreed(Some(1), &ours, &theirs).is_empty());
        assert!(Capabilities::agreed(None, &ours, &theirs).is_empty());
    }

    #[test]
    fn version_2_is_spoken_with_a_version_2_peer_and_1_with_a_version_1_peer() {
        let v1 = VersionRange { min: 1, max: 1 };
        assert_eq!(VersionRange::CURRENT, VersionRange { min: 1, max: 2 });
        assert_eq!(VersionRange::CURRENT.shared(VersionRange::CURRENT), Some(2));
        assert_eq!(VersionRange::CURRENT.shared(v1), Some(1));
        assert_eq!(v1.shared(VersionRange::CURRENT), Some(1));
    }

    #[test]
    fn unknown_optional_fields_are_ignored() {
        // What a later build may add: fields at every level, and a capability we do not know.
        let mut v: serde_json::Value = serde_json::from_str(V1_SESSION_START).unwrap();
        v["later_field"] = serde_json::json!({"x": 1});
        v["config"]["later_field"] = serde_json::json!(true);
        v["config"]["user"]["later_field"] = serde_json::json!([1, 2]);
        v["config"]["user"]["network"]["later_field"] = serde_json::json!("y");
        v["identity"]["later_field"] = serde_json::json!(null);
        let req: Request = serde_json::from_value(v).unwrap();
        assert_eq!(req, Request::SessionStart(Box::new(v1_spec())));
        let hello: Request = serde_json::from_str(
            r#"{"op":"hello","protocol":{"min":2,"max":3},"client_version":"9","capabilities":["from_the_future"],"later":1}"#,
        )
        .unwrap();
        let Request::Hello { capabilities, .. } = hello else { panic!("not a hello") };
        assert!(Capabilities::agreed(Some(2), &Capabilities::current(), &capabilities).is_empty());
        let end: Request =
            serde_json::from_str(r#"{"op":"session_end","session":"s","later":{"a":1}}"#).unwrap();
        assert_eq!(
            end,
            Request::SessionEnd(SessionEnd { session: "s".into(), ..Default::default() })
        );
    }

    #[test]
    fn layer_sources_are_an_optional_field_behind_their_capability() {
        assert!(Capabilities::current().contains(LAYER_DIGESTS));
        // Without sources the layers encode exactly as before (see the version-1 tests).
        let json = serde_json::to_value(PolicyLayers::default()).unwrap();
        assert!(json.get("sources").is_none(), "{json}");
        let layers = PolicyLayers {
            sources: vec![LayerSource {
                kind: LayerKind::User,
                name: "~/.airlock/config.toml".into(),
                digest: "ab".into(),
                text: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&layers).unwrap(),
            r#"{"user":null,"repo":null,"review_servers":[],"sources":[{"kind":"user","name":"~/.airlock/config.toml","digest":"ab"}]}"#
        );
        let back: PolicyLayers = serde_json::from_str(
            r#"{"user":null,"repo":null,"review_servers":[],"sources":[{"kind":"repo","name":"r","digest":"cd","text":"[network]\n"}],"later":1}"#,
        )
        .unwrap();
        assert_eq!(back.sources[0].text.as_deref(), Some("[network]\n"));
        let err = Response::Error { code: ErrorCode::UnknownLayer, message: "m".into() };
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"reply":"error","code":"unknown_layer","message":"m"}"#
        );
    }

    #[test]
    fn layer_source_texts_never_reach_debug_output() {
        let source = LayerSource {
            kind: LayerKind::User,
            name: "~/.airlock/config.toml".into(),
            digest: "ab".into(),
            text: Some("[mcp.x]\nK = \"s3cret\"\n".into()),
        };
        let shown = format!("{source:?}");
        assert!(!shown.contains("s3cret") && shown.contains("text_bytes"), "{shown}");
    }

    #[test]
    fn credential_values_never_reach_debug_output() {
        let shown = format!("{:?}", v1_spec());
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("GITHUB_TOKEN"), "{shown}");
    }

    #[test]
    fn wire_names_are_stable() {
        let hello = Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "0.1.0".into(),
            capabilities: Capabilities::default(),
        };
        let json = serde_json::to_string(&hello).unwrap();
        assert_eq!(json, r#"{"op":"hello","protocol":{"min":1,"max":2},"client_version":"0.1.0"}"#);
        assert_eq!(
            serde_json::to_string(&Request::QuitIfIdle).unwrap(),
            r#"{"op":"quit_if_idle"}"#
        );
        let end = Request::SessionEnd(SessionEnd { session: "s".into(), ..Default::default() });
        let json = serde_json::to_string(&end).unwrap();
        assert!(json.starts_with(r#"{"op":"session_end","session":"s""#));
        // A container session's stop reason is optional: absent, the message is as before.
        assert!(!json.contains("stopped"), "{json}");
        let stopped_end = Request::SessionEnd(SessionEnd {
            session: "s".into(),
            stopped: Some("audit_budget".into()),
            ..Default::default()
        });
        let json = serde_json::to_string(&stopped_end).unwrap();
        assert!(json.contains(r#""stopped":"audit_budget""#), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), stopped_end);
        let stopped = Response::SessionStopped {
            session: "s".into(),
            reason: "audit_budget".into(),
            message: "m".into(),
        };
        assert_eq!(
            serde_json::to_string(&stopped).unwrap(),
            r#"{"reply":"session_stopped","session":"s","reason":"audit_budget","message":"m"}"#
        );
        let err = Response::Error { code: ErrorCode::PeerUid, message: "m".into() };
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"reply":"error","code":"peer_uid","message":"m"}"#
        );
    }

    #[test]
    fn frames_round_trip_in_pieces() {
        let msgs =
            vec![Request::Status, Request::QuitIfIdle, Request::SessionStart(Box::default())];
        let mut bytes = Vec::new();
        for m in &msgs {
            bytes.extend(encode(m).unwrap());
        }
        let mut fb = FrameBuf::new();
        let mut got = Vec::new();
        for b in bytes {
            fb.extend(&[b]);
            if let Some(m) = fb.next_message::<Request>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, msgs);
        assert!(!fb.is_partial());
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let mut fb = FrameBuf::new();
        fb.extend(&u32::MAX.to_be_bytes());
        assert!(matches!(fb.next_frame(), Err(FrameError::TooLarge(_))));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut fb = FrameBuf::new();
            fb.extend(&data);
            while let Ok(Some(_)) = fb.next_message::<Request>() {}
        }

        #[test]
        fn specs_round_trip(repo in "[a-z0-9._-]{1,20}", cmd in proptest::collection::vec(".*", 0..4)) {
            let spec = SessionSpec { repo, command: cmd, ..Default::default() };
            let req = Request::SessionStart(Box::new(spec));
            let mut fb = FrameBuf::new();
            fb.extend(&encode(&req).unwrap());
            prop_assert_eq!(fb.next_message::<Request>().unwrap(), Some(req));
        }
    }
}
