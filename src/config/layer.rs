//! One configuration file (`policy.toml`, `config.toml`, `.airlock.toml`, or the standalone
//! proxy's `--config`): its schema, validated by walking the spanned TOML tree so every problem
//! is reported at `file:line:col` with a fix, and the parsed [`LayerDoc`] the client sends to the
//! daemon.
//!
//! Schema (docs/configuration.md is the reference):
//! ```toml
//! [network]
//! mode = "allowlist"            # or "blocklist"
//! allow = ["anthropic.com", "*.githubusercontent.com", "=pypi.org", "git.corp:22"]
//! block = ["pastebin.com"]
//! allow_private = ["127.0.0.2/32"]
//! [env]
//! pass = ["RUST_LOG"]
//! [mcp.github]
//! GITHUB_TOKEN = { from_env = "GITHUB_TOKEN" }
//! [review]                      # managed and user layers only
//! servers = ["https://review.corp.example"]
//! [terminal]                    # managed and user layers only
//! clipboard = "deny"            # or "allow" (OSC 52 writes; reads are always dropped)
//! [sandbox]
//! mounts = ["~/.cargo/bin:ro", "~/.rustup:ro", "/opt/tools"]   # HOST[:SANDBOX][:ro|:rw]
//! cache = ["cargo", "npm", "pip"]                                # per-repo writable caches
//! [audit]                       # managed and user layers only
//! burst = 20                    # identical refusals written one by one per second (0: no limit)
//! session_budget = "1GiB"       # audit bytes per session; past it the session is stopped
//! min_free = "256MiB"           # free space the log's file system keeps; below it, no traffic
//! [logs]                        # managed and user layers only
//! keep = "90d"                  # delete whole dated log files older than this (d or h)
//! [publish]                     # managed and user layers only
//! auto = true                   # publish the repo's new lines after each `airlock run`/`exec`
//! timeout = "10s"               # how long that end-of-session publish may take
//! [gate]                        # trusted layers; docs/gates.md
//! hosts = ["api.stripe.com", "=prod-db.internal:5432"]   # held until a person decides
//! timeout = "110s"              # how long a held attempt waits for that decision
//! commands = ["git push*"]      # agents' shell commands asked for first (advisory)
//! [[gate.rule]]
//! host = "api.stripe.com"       # also gated; the rule gives its severity
//! severity = "high"             # "low", "medium" (default) or "high"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::ConfigError;
use super::diag::{Diagnostic, line_col, suggestion};
pub use super::phase::PhaseDoc;
use super::policy_tests::{self, PolicyTests};
use crate::gate::Severity;
use crate::policy::{Entry, EntryKind, GateEntry, LayerKind, Mode, PolicyLayer, PortSpec};
use crate::sandbox::termfilter::Clipboard;

const TOP_KEYS: &[&str] = &[
    "network", "env", "mcp", "review", "terminal", "audit", "sandbox", "logs", "publish", "gate",
    "phase", "test", "policy",
];
const GATE_KEYS: &[&str] = &["hosts", "rule", "timeout", "commands", "self_approve"];
const GATE_RULE_KEYS: &[&str] = &["host", "severity"];
const SANDBOX_KEYS: &[&str] = &["mounts", "cache", "backend"];
const LOGS_KEYS: &[&str] = &["keep"];
const PUBLISH_KEYS: &[&str] = &["auto", "timeout"];
const AUDIT_KEYS: &[&str] = &["burst", "session_budget", "min_free"];
const NETWORK_KEYS: &[&str] = &["mode", "allow", "block", "allow_private"];
const ENV_KEYS: &[&str] = &["pass"];
const REVIEW_KEYS: &[&str] = &["servers"];
const TERMINAL_KEYS: &[&str] = &["clipboard"];
const CLIPBOARD_VALUES: &[&str] = &["deny", "allow"];
const CREDENTIAL_KEYS: &[&str] = &["from_env"];
const MODES: &[&str] = &["allowlist", "blocklist"];

/// The parsed content of one layer file: what the client sends to the daemon (DESIGN §4) and
/// what `policy show` prints. Entries keep their text as written, so a rule shown to the user is
/// the rule in their file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDoc {
    pub kind: LayerKind,
    /// The file as the user sees it (`~/.airlock/config.toml`, `/src/app/.airlock.toml`).
    pub name: String,
    /// Lowercase hex SHA-256 of the file's bytes (the trust record compares this).
    pub digest: String,
    #[serde(default)]
    pub network: NetworkDoc,
    /// `[env] pass`: host environment variables passed into the sandbox.
    #[serde(default)]
    pub env_pass: Vec<String>,
    /// `[mcp.<server>]`: credential variables per MCP server.
    #[serde(default)]
    pub mcp: BTreeMap<String, BTreeMap<String, Credential>>,
    /// `[review] servers` (managed and user layers only): URLs or hosts, always blocked.
    #[serde(default)]
    pub review_servers: Vec<String>,
    /// `[terminal]` (managed and user layers only).
    #[serde(default)]
    pub terminal: TerminalDoc,
    /// `[audit]` (managed and user layers only).
    #[serde(default)]
    pub audit: AuditDoc,
    /// `[sandbox]`: mounts and caches (the CLI's; never sent to the daemon).
    #[serde(default)]
    pub sandbox: SandboxDoc,
    /// `[logs]` (managed and user layers only).
    #[serde(default)]
    pub logs: LogsDoc,
    /// `[publish]` (managed and user layers only; the CLI's, never sent to the daemon).
    #[serde(default)]
    pub publish: PublishDoc,
    /// `[gate]`: targets held for a person's decision.
    #[serde(default)]
    pub gate: GateDoc,
    /// `[phase.NAME.network]`: per phase, the `allow`/`block` lists evaluated in place of
    /// `[network]`'s while that phase is in force (`super::phase`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases: BTreeMap<String, PhaseDoc>,
}

/// `[gate]`: gated targets, each in the `allow` entry syntax, and the decision timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDoc {
    /// `hosts`, as written (severity `medium`).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// `[[gate.rule]]`: a gated target with its own severity.
    #[serde(default)]
    pub rules: Vec<GateRuleDoc>,
    /// `timeout`, in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `commands`: shell-command patterns (`*` any text, `?` one character) an agent's tool
    /// calls are gated on (advisory: docs/gates.md, "Gated tool calls").
    #[serde(default)]
    pub commands: Vec<String>,
    /// `self_approve` (managed layer only): with a review server, the requester may approve
    /// their own gates (the server may refuse to honour it; docs/gates.md).
    #[serde(default)]
    pub self_approve: Option<bool>,
}

/// One `[[gate.rule]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRuleDoc {
    pub host: String,
    pub severity: Severity,
}

/// `[publish]`: publishing at session end (`None` when the file is silent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishDoc {
    /// `auto`: publish the repo's new lines on the host after each session.
    #[serde(default)]
    pub auto: Option<bool>,
    /// `timeout`, in milliseconds: the bound on that end-of-session publish.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `[sandbox]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxDoc {
    /// `mounts`: each spec as written, with where it is written.
    #[serde(default)]
    pub mounts: Vec<Located>,
    /// `cache`: cache names ([`crate::sandbox::toolchain::CACHES`]).
    #[serde(default)]
    pub cache: Vec<String>,
    /// `backend`: `native`, `docker` or `podman` (managed and user layers only); `--backend`
    /// overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::container::Backend>,
}

/// A value as written and its `file:line:col` (for refusals made later, at launch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    pub text: String,
    pub at: String,
}

/// `[logs]`: log retention (`None` when the file is silent: logs are kept forever).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsDoc {
    /// `keep`, in seconds.
    #[serde(default)]
    pub keep_secs: Option<u64>,
}

/// `[audit]`: bounds on a session's audit volume (`None` when the file is silent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDoc {
    /// `burst`: identical refusals per second written one by one.
    #[serde(default)]
    pub burst: Option<u32>,
    /// `session_budget`, in bytes.
    #[serde(default)]
    pub session_budget: Option<u64>,
    /// `min_free`, in bytes.
    #[serde(default)]
    pub min_free: Option<u64>,
}

/// `[terminal]`: what the relay lets reach the caller's terminal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalDoc {
    /// `clipboard`: whether OSC 52 clipboard writes pass (`None` when the file is silent).
    #[serde(default)]
    pub clipboard: Option<Clipboard>,
}

/// `[network]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkDoc {
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub block: Vec<String>,
    #[serde(default)]
    pub allow_private: Vec<IpNet>,
}

/// One `[mcp.<server>]` credential: a literal value or the name of a host variable to copy.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Credential {
    FromEnv { from_env: String },
    Value(String),
}

impl fmt::Debug for Credential {
    // Literal credentials are secrets: never in logs or panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FromEnv { from_env } => {
                f.debug_struct("FromEnv").field("from_env", from_env).finish()
            }
            Self::Value(_) => f.write_str("Value(<redacted>)"),
        }
    }
}

/// A parsed file and the warnings it raised (reported; evaluation continues).
#[derive(Debug, Clone)]
pub struct ParsedLayer {
    pub doc: LayerDoc,
    pub warnings: Vec<Diagnostic>,
    /// `[[test]]` tables and `[policy]` (the CLI's; never sent to the daemon).
    pub tests: PolicyTests,
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Parses one layer file. `name` is the file as the user sees it. Either the whole file is
/// valid and returned, or every problem found is returned: nothing is half-applied.
pub fn parse_layer(kind: LayerKind, name: &str, bytes: &[u8]) -> Result<ParsedLayer, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let valid = &bytes[..e.valid_up_to()];
        // The valid prefix is UTF-8 by construction, so this never falls back.
        let prefix = std::str::from_utf8(valid).unwrap_or_default();
        let span = prefix.len()..prefix.len();
        ConfigError::Invalid(vec![Diagnostic::at(
            name,
            prefix,
            &span,
            "the file is not valid UTF-8 (TOML files must be UTF-8); re-save it as UTF-8",
        )])
    })?;
    let root = DeTable::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        ConfigError::Invalid(vec![Diagnostic::at(
            name,
            text,
            &span,
            format!("malformed TOML: {}; fix the syntax", e.message().trim_end()),
        )])
    })?;
    let mut walker = Walker {
        name,
        text,
        kind,
        errors: Vec::new(),
        warnings: Vec::new(),
        tests: PolicyTests::default(),
    };
    let mut doc = LayerDoc {
        kind,
        name: name.to_owned(),
        digest: digest(bytes),
        network: NetworkDoc::default(),
        env_pass: Vec::new(),
        mcp: BTreeMap::new(),
        review_servers: Vec::new(),
        terminal: TerminalDoc::default(),
        audit: AuditDoc::default(),
        sandbox: SandboxDoc::default(),
        logs: LogsDoc::default(),
        publish: PublishDoc::default(),
        gate: GateDoc::default(),
        phases: BTreeMap::new(),
    };
    walker.root(root.get_ref(), &mut doc);
    if walker.errors.is_empty() {
        walker.warnings.sort_by_key(|(offset, _)| *offset);
        Ok(ParsedLayer {
            doc,
            warnings: walker.warnings.into_iter().map(|(_, d)| d).collect(),
            tests: walker.tests,
        })
    } else {
        walker.errors.sort_by_key(|(offset, _)| *offset);
        Err(ConfigError::Invalid(walker.errors.into_iter().map(|(_, d)| d).collect()))
    }
}

pub(super) struct Walker<'a> {
    name: &'a str,
    text: &'a str,
    kind: LayerKind,
    errors: Vec<(usize, Diagnostic)>,
    warnings: Vec<(usize, Diagnostic)>,
    tests: PolicyTests,
}

pub(super) type Item<'i> = Spanned<DeValue<'i>>;

impl Walker<'_> {
    pub(super) fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        let d = Diagnostic::at(self.name, self.text, &span, message);
        self.errors.push((span.start, d));
    }

    fn warn(&mut self, span: Range<usize>, message: impl Into<String>) {
        let d = Diagnostic::at(self.name, self.text, &span, format!("warning: {}", message.into()));
        self.warnings.push((span.start, d));
    }

    pub(super) fn unknown(
        &mut self,
        key: &Spanned<std::borrow::Cow<'_, str>>,
        section: &str,
        known: &[&str],
    ) {
        let k = key.get_ref();
        if matches!(k.as_ref(), "port" | "ports") {
            // Publishing a port opens the host's browser to the agent: only the person at the
            // command line decides that (docs/security.md, "Ports").
            self.error(
                key.span(),
                format!(
                    "`{k}` in {section}: ports cannot be published from a configuration file; \
                     pass `--port [HOST_IP:]HOSTPORT:PORT` to `airlock exec`/`airlock run`"
                ),
            );
            return;
        }
        self.error(key.span(), format!("unknown key `{k}` in {section}; {}", suggestion(k, known)));
    }

    fn root(&mut self, root: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in root.iter() {
            match key.get_ref().as_ref() {
                "network" => {
                    if let Some(t) = self.table(value, "[network]") {
                        self.network(t, doc);
                    }
                }
                "env" => {
                    if let Some(t) = self.table(value, "[env]") {
                        self.env(t, doc);
                    }
                }
                "mcp" => {
                    if let Some(t) = self.table(value, "[mcp]") {
                        self.mcp(t, doc);
                    }
                }
                "review" => {
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "[review] is not allowed in the {} layer: review-plane servers may \
                                 be set only in the managed layer (/etc/airlock/policy.toml) or the \
                                 user layer (~/.airlock/config.toml); move it there",
                                self.kind
                            ),
                        );
                    } else if let Some(t) = self.table(value, "[review]") {
                        self.review(t, doc);
                    }
                }
                "terminal" => {
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "[terminal] is not allowed in the {} layer: it may only be set in \
                                 ~/.airlock/config.toml or the managed policy \
                                 (/etc/airlock/policy.toml), so a repo cannot open your \
                                 clipboard to its agent; move it there",
                                self.kind
                            ),
                        );
                    } else if let Some(t) = self.table(value, "[terminal]") {
                        self.terminal(t, doc);
                    }
                }
                "audit" => {
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "[audit] is not allowed in the {} layer: the audit log's bounds \
                                 may only be set in ~/.airlock/config.toml or the managed policy \
                                 (/etc/airlock/policy.toml), so a repo cannot quiet or fill its \
                                 own audit trail; move it there",
                                self.kind
                            ),
                        );
                    } else if let Some(t) = self.table(value, "[audit]") {
                        self.audit(t, doc);
                    }
                }
                "sandbox" => {
                    if let Some(t) = self.table(value, "[sandbox]") {
                        self.sandbox(t, doc);
                    }
                }
                "logs" => {
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "[logs] is not allowed in the {} layer: log retention may only \
                                 be set in ~/.airlock/config.toml or the managed policy \
                                 (/etc/airlock/policy.toml), so a repo cannot erase its own \
                                 audit trail; move it there",
                                self.kind
                            ),
                        );
                    } else if let Some(t) = self.table(value, "[logs]") {
                        self.logs(t, doc);
                    }
                }
                "publish" => {
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "[publish] is not allowed in the {} layer: publishing runs on \
                                 the host with your review token, so only ~/.airlock/config.toml \
                                 or the managed policy (/etc/airlock/policy.toml) may turn it on; \
                                 move it there",
                                self.kind
                            ),
                        );
                    } else if let Some(t) = self.table(value, "[publish]") {
                        self.publish(t, doc);
                    }
                }
                "gate" => {
                    if let Some(t) = self.table(value, "[gate]") {
                        self.gate(t, doc);
                    }
                }
                "phase" => {
                    if let Some(t) = self.table(value, "[phase]") {
                        self.phases(t, doc);
                    }
                }
                "test" => {
                    let (tests, problems) = policy_tests::walk_tests(self.name, self.text, value);
                    self.tests.tests = tests;
                    self.problems(problems);
                }
                "policy" => {
                    let (require, problems) =
                        policy_tests::walk_policy(self.kind, key.span(), value);
                    self.tests.require_tests = require;
                    self.problems(problems);
                }
                _ => self.unknown(key, "the top level", TOP_KEYS),
            }
        }
    }

    fn problems(&mut self, problems: policy_tests::Problems) {
        for (span, message) in problems {
            self.error(span, message);
        }
    }

    fn gate(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "hosts" => {
                    for (text, span) in self.strings(value, "gate.hosts") {
                        if let Some(entry) = self.gate_entry(&text, &span, "gate.hosts") {
                            doc.gate.hosts.push(entry);
                        }
                    }
                }
                "rule" => {
                    let DeValue::Array(items) = value.get_ref() else {
                        self.error(
                            value.span(),
                            format!(
                                "gate.rule must be an array of tables ([[gate.rule]] with host \
                                 and severity), found {}",
                                value.get_ref().type_str()
                            ),
                        );
                        continue;
                    };
                    for (i, item) in items.iter().enumerate() {
                        if let Some(t) = self.table(item, &format!("gate.rule[{i}]"))
                            && let Some(rule) = self.gate_rule(t, item.span())
                        {
                            doc.gate.rules.push(rule);
                        }
                    }
                }
                "timeout" => match value.get_ref() {
                    DeValue::String(s) => match parse_gate_timeout(s) {
                        Ok(ms) => doc.gate.timeout_ms = Some(ms),
                        Err(e) => self.error(value.span(), format!("gate.timeout: {e}")),
                    },
                    other => self.error(
                        value.span(),
                        format!(
                            "gate.timeout must be a string like \"110s\" or \"5m\", found {}",
                            other.type_str()
                        ),
                    ),
                },
                "commands" => {
                    for (pattern, span) in self.strings(value, "gate.commands") {
                        match crate::gate::check_command_pattern(&pattern) {
                            Ok(()) => doc.gate.commands.push(pattern),
                            Err(why) => {
                                self.error(span, format!("gate.commands entry {pattern:?}: {why}"))
                            }
                        }
                    }
                }
                "self_approve" if self.kind != LayerKind::Managed => self.error(
                    key.span(),
                    format!(
                        "gate.self_approve is not allowed in the {} layer: only the managed \
                         policy (/etc/airlock/policy.toml) may let requesters approve their own \
                         gates; remove it here",
                        self.kind
                    ),
                ),
                "self_approve" => match value.get_ref() {
                    DeValue::Boolean(b) => doc.gate.self_approve = Some(*b),
                    other => self.error(
                        value.span(),
                        format!(
                            "gate.self_approve must be true or false, found {}",
                            other.type_str()
                        ),
                    ),
                },
                _ => self.unknown(key, "[gate]", GATE_KEYS),
            }
        }
    }

    /// A gated target in the entry syntax, kept as written when it parses. Read like a
    /// `block` entry: without a port it covers every port (a gate never allows anything, so
    /// covering more only holds more).
    fn gate_entry(&mut self, text: &str, span: &Range<usize>, what: &str) -> Option<String> {
        match Entry::parse(text, EntryKind::Block) {
            Ok(_) => Some(text.to_owned()),
            Err(e) => {
                self.error(span.clone(), format!("{what} entry {text:?}: {}", e.message()));
                None
            }
        }
    }

    fn gate_rule(&mut self, table: &DeTable<'_>, span: Range<usize>) -> Option<GateRuleDoc> {
        let (mut host, mut severity, mut ok) = (None, Severity::default(), true);
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "host" => match self.string(value, "gate.rule.host") {
                    Some(text) => {
                        host = self.gate_entry(text, &value.span(), "gate.rule.host");
                        ok &= host.is_some();
                    }
                    None => ok = false,
                },
                "severity" => match self.string(value, "gate.rule.severity") {
                    Some(text) => match Severity::parse(text) {
                        Some(s) => severity = s,
                        None => {
                            let hint = suggestion(text, Severity::NAMES);
                            self.error(
                                value.span(),
                                format!(
                                    "gate.rule.severity must be \"low\", \"medium\" or \
                                     \"high\", found {text:?}; {hint}"
                                ),
                            );
                            ok = false;
                        }
                    },
                    None => ok = false,
                },
                _ => {
                    self.unknown(key, "[[gate.rule]]", GATE_RULE_KEYS);
                    ok = false;
                }
            }
        }
        match host {
            Some(host) if ok => Some(GateRuleDoc { host, severity }),
            None if ok => {
                self.error(
                    span,
                    "a [[gate.rule]] table needs `host = \"...\"` (the gated target, in the \
                     allow-entry syntax)",
                );
                None
            }
            _ => None,
        }
    }

    fn sandbox(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        use crate::sandbox::{toolchain, usermount};
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "mounts" => {
                    for (text, span) in self.strings(value, "sandbox.mounts") {
                        match usermount::parse(&text) {
                            Ok(_) => {
                                let (line, col) = line_col(self.text, span.start);
                                let at = format!("{}:{line}:{col}", self.name);
                                doc.sandbox.mounts.push(Located { text, at });
                            }
                            Err(e) => self.error(span, e.to_string()),
                        }
                    }
                }
                "cache" => {
                    let known = toolchain::cache_names();
                    for (name, span) in self.strings(value, "sandbox.cache") {
                        if known.contains(&name.as_str()) {
                            if !doc.sandbox.cache.contains(&name) {
                                doc.sandbox.cache.push(name);
                            }
                        } else {
                            let hint = suggestion(&name, &known);
                            self.error(
                                span,
                                format!(
                                    "sandbox.cache has no cache {name:?} (known: {}); {hint}",
                                    known.join(", ")
                                ),
                            );
                        }
                    }
                }
                "backend" => {
                    let Some(text) = self.string(value, "sandbox.backend") else { continue };
                    if !matches!(self.kind, LayerKind::Managed | LayerKind::User) {
                        self.error(
                            key.span(),
                            format!(
                                "sandbox.backend is not allowed in the {} layer: which engine \
                                 runs sessions is the machine's choice; set it in \
                                 ~/.airlock/config.toml (or pass --backend)",
                                self.kind
                            ),
                        );
                        continue;
                    }
                    match text.parse() {
                        Ok(b) => doc.sandbox.backend = Some(b),
                        Err(e) => self.error(value.span(), format!("sandbox.backend: {e}")),
                    }
                }
                _ => self.unknown(key, "[sandbox]", SANDBOX_KEYS),
            }
        }
    }

    fn audit(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "burst" => match value.get_ref() {
                    DeValue::Integer(i) => match i.as_str().parse::<u32>() {
                        Ok(n) => doc.audit.burst = Some(n),
                        Err(_) => self.error(
                            value.span(),
                            format!(
                                "audit.burst must be a whole number from 0 to {}, found {}; \
                                 0 turns the rate limit off",
                                u32::MAX,
                                i.as_str()
                            ),
                        ),
                    },
                    other => self.error(
                        value.span(),
                        format!("audit.burst must be an integer, found {}", other.type_str()),
                    ),
                },
                "session_budget" => {
                    doc.audit.session_budget = self.size(value, "audit.session_budget")
                }
                "min_free" => doc.audit.min_free = self.size(value, "audit.min_free"),
                _ => self.unknown(key, "[audit]", AUDIT_KEYS),
            }
        }
    }

    fn logs(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "keep" => match value.get_ref() {
                    DeValue::String(s) => match crate::audit::retention::parse_keep(s) {
                        Ok(d) => doc.logs.keep_secs = Some(d.as_secs()),
                        Err(e) => self.error(value.span(), format!("logs.keep: {e}")),
                    },
                    other => self.error(
                        value.span(),
                        format!(
                            "logs.keep must be a string like \"90d\" or \"36h\", found {}",
                            other.type_str()
                        ),
                    ),
                },
                _ => self.unknown(key, "[logs]", LOGS_KEYS),
            }
        }
    }

    fn publish(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "auto" => match value.get_ref() {
                    DeValue::Boolean(b) => doc.publish.auto = Some(*b),
                    other => self.error(
                        value.span(),
                        format!("publish.auto must be true or false, found {}", other.type_str()),
                    ),
                },
                "timeout" => match value.get_ref() {
                    DeValue::String(s) => match parse_publish_timeout(s) {
                        Ok(ms) => doc.publish.timeout_ms = Some(ms),
                        Err(e) => self.error(value.span(), format!("publish.timeout: {e}")),
                    },
                    other => self.error(
                        value.span(),
                        format!(
                            "publish.timeout must be a string like \"10s\" or \"1m\", found {}",
                            other.type_str()
                        ),
                    ),
                },
                _ => self.unknown(key, "[publish]", PUBLISH_KEYS),
            }
        }
    }

    /// A size: an integer number of bytes or a string like `"512MiB"` (`B`, `KiB`, `MiB`,
    /// `GiB`, `TiB`; binary units).
    fn size(&mut self, value: &Item<'_>, what: &str) -> Option<u64> {
        let parsed = match value.get_ref() {
            DeValue::Integer(i) => i.as_str().parse::<u64>().map_err(|_| i.as_str().to_owned()),
            DeValue::String(s) => parse_size(s).ok_or_else(|| format!("{s:?}")),
            other => {
                self.error(
                    value.span(),
                    format!(
                        "{what} must be a size like \"512MiB\" or a number of bytes, found {}",
                        other.type_str()
                    ),
                );
                return None;
            }
        };
        match parsed {
            Ok(n) => Some(n),
            Err(found) => {
                self.error(
                    value.span(),
                    format!(
                        "{what} must be a size like \"512MiB\" (units B, KiB, MiB, GiB, TiB) or \
                         a number of bytes, found {found}"
                    ),
                );
                None
            }
        }
    }

    pub(super) fn table<'v, 'i>(
        &mut self,
        value: &'v Item<'i>,
        what: &str,
    ) -> Option<&'v DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be a table, found {}", other.type_str()),
                );
                None
            }
        }
    }

    fn string<'v>(&mut self, value: &'v Item<'_>, what: &str) -> Option<&'v str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// An array of strings, each with its span; wrong element types are reported one by one.
    fn strings(&mut self, value: &Item<'_>, what: &str) -> Vec<(String, Range<usize>)> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(
                value.span(),
                format!(
                    "{what} must be an array of strings (e.g. {what} = [\"...\"]), found {}",
                    value.get_ref().type_str()
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(s) = self.string(item, &format!("{what}[{i}]")) {
                out.push((s.to_owned(), item.span()));
            }
        }
        out
    }

    fn network(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        let (mut allow, mut block) = (Vec::new(), Vec::new());
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "mode" => {
                    if let Some(mode) = self.string(value, "network.mode") {
                        doc.network.mode = match mode {
                            "allowlist" => Some(Mode::Allowlist),
                            "blocklist" => Some(Mode::Blocklist),
                            other => {
                                let hint = suggestion(other, MODES);
                                self.error(
                                    value.span(),
                                    format!(
                                        "network.mode must be \"allowlist\" or \"blocklist\", \
                                         found {other:?}; {hint}"
                                    ),
                                );
                                None
                            }
                        };
                    }
                }
                "allow" => allow = self.entries(value, EntryKind::Allow, "network"),
                "block" => block = self.entries(value, EntryKind::Block, "network"),
                "allow_private" => doc.network.allow_private = self.allow_private(value),
                _ => self.unknown(key, "[network]", NETWORK_KEYS),
            }
        }
        self.cross_check(&allow, &block, "network");
        doc.network.allow = allow.into_iter().map(|(e, _)| e.text().to_owned()).collect();
        doc.network.block = block.into_iter().map(|(e, _)| e.text().to_owned()).collect();
    }

    /// The entries of `<section>.allow` or `<section>.block` (`section` is `network` or
    /// `phase.NAME.network`), each with its span.
    pub(super) fn entries(
        &mut self,
        value: &Item<'_>,
        kind: EntryKind,
        section: &str,
    ) -> Vec<(Entry, Range<usize>)> {
        let list = if kind == EntryKind::Allow {
            format!("{section}.allow")
        } else {
            format!("{section}.block")
        };
        let list = list.as_str();
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        let mut out = Vec::new();
        for (text, span) in self.strings(value, list) {
            let entry = match Entry::parse(&text, kind) {
                Ok(e) => e,
                Err(e) => {
                    self.error(span, format!("{list} entry {text:?}: {}", e.message()));
                    continue;
                }
            };
            if let Some(first) = seen.get(&entry.canonical()) {
                let (line, _) = line_col(self.text, first.start);
                self.warn(
                    span.clone(),
                    format!(
                        "{text:?} is listed twice in {list} (first at line {line}); remove one"
                    ),
                );
            } else {
                seen.insert(entry.canonical(), span.clone());
            }
            out.push((entry, span));
        }
        out
    }

    /// Warns about an allow entry that a block entry of the same file fully covers: block wins.
    pub(super) fn cross_check(
        &mut self,
        allow: &[(Entry, Range<usize>)],
        block: &[(Entry, Range<usize>)],
        section: &str,
    ) {
        for (b, bspan) in block {
            for (a, aspan) in allow {
                let covers = match b.port_spec() {
                    PortSpec::Default | PortSpec::Any => true,
                    PortSpec::Port(_) => b.port_spec() == a.port_spec(),
                };
                if covers && a.pattern() == b.pattern() {
                    let (line, _) = line_col(self.text, aspan.start);
                    self.warn(
                        bspan.clone(),
                        format!(
                            "{:?} is in both {section}.allow (line {line}) and {section}.block; \
                             block wins, so the allow entry has no effect",
                            b.text()
                        ),
                    );
                }
            }
        }
    }

    fn allow_private(&mut self, value: &Item<'_>) -> Vec<IpNet> {
        let mut out = Vec::new();
        for (text, span) in self.strings(value, "network.allow_private") {
            match parse_private(&text) {
                Ok(net) => out.push(net),
                Err(why) => {
                    self.error(span, format!("network.allow_private entry {text:?}: {why}"))
                }
            }
        }
        out
    }

    fn env(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "pass" => {
                    for (name, span) in self.strings(value, "env.pass") {
                        if is_env_name(&name) {
                            doc.env_pass.push(name);
                        } else {
                            self.error(
                                span,
                                format!(
                                    "env.pass entry {name:?} is not an environment variable name \
                                     (letters, digits and _, not starting with a digit)"
                                ),
                            );
                        }
                    }
                }
                _ => self.unknown(key, "[env]", ENV_KEYS),
            }
        }
    }

    fn mcp(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (server, value) in table.iter() {
            let server_name = server.get_ref().as_ref();
            let section = format!("[mcp.{server_name}]");
            let Some(creds) = self.table(value, &section) else { continue };
            let mut out = BTreeMap::new();
            for (key, value) in creds.iter() {
                let var = key.get_ref().as_ref();
                if !is_env_name(var) {
                    self.error(
                        key.span(),
                        format!(
                            "{section} key `{var}` is not an environment variable name (letters, \
                             digits and _, not starting with a digit)"
                        ),
                    );
                    continue;
                }
                if let Some(c) = self.credential(value, &format!("mcp.{server_name}.{var}")) {
                    out.insert(var.to_owned(), c);
                }
            }
            doc.mcp.insert(server_name.to_owned(), out);
        }
    }

    fn credential(&mut self, value: &Item<'_>, what: &str) -> Option<Credential> {
        match value.get_ref() {
            DeValue::String(s) => Some(Credential::Value(s.to_string())),
            DeValue::Table(t) => {
                let mut from = None;
                for (key, v) in t.iter() {
                    if key.get_ref() == "from_env" {
                        from = self.string(v, &format!("{what}.from_env")).map(|s| (s, v.span()));
                    } else {
                        self.unknown(key, what, CREDENTIAL_KEYS);
                    }
                }
                match from {
                    Some((var, _)) if is_env_name(var) => {
                        Some(Credential::FromEnv { from_env: var.to_owned() })
                    }
                    Some((var, span)) => {
                        self.error(
                            span,
                            format!("{what}.from_env {var:?} is not an environment variable name"),
                        );
                        None
                    }
                    None => {
                        self.error(
                            value.span(),
                            format!(
                                "{what} must be a string or {{ from_env = \"VAR\" }}; add from_env"
                            ),
                        );
                        None
                    }
                }
            }
            other => {
                self.error(
                    value.span(),
                    format!(
                        "{what} must be a string or {{ from_env = \"VAR\" }}, found {}",
                        other.type_str()
                    ),
                );
                None
            }
        }
    }

    fn review(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "servers" => {
                    for (server, span) in self.strings(value, "review.servers") {
                        match super::review_host(&server) {
                            Ok(_) => doc.review_servers.push(server),
                            Err(why) => self.error(
                                span,
                                format!(
                                    "review.servers entry {server:?} is not a URL or host: {why}"
                                ),
                            ),
                        }
                    }
                }
                _ => self.unknown(key, "[review]", REVIEW_KEYS),
            }
        }
    }

    fn terminal(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "clipboard" => {
                    if let Some(v) = self.string(value, "terminal.clipboard") {
                        doc.terminal.clipboard = match v {
                            "deny" => Some(Clipboard::Deny),
                            "allow" => Some(Clipboard::Allow),
                            other => {
                                let hint = suggestion(other, CLIPBOARD_VALUES);
                                self.error(
                                    value.span(),
                                    format!(
                                        "terminal.clipboard must be \"deny\" or \"allow\", found \
                                         {other:?}; {hint}"
                                    ),
                                );
                                None
                            }
                        };
                    }
                }
                _ => self.unknown(key, "[terminal]", TERMINAL_KEYS),
            }
        }
    }
}

/// `"512MiB"`-style sizes: a whole number and an optional binary unit (`B`, `KiB`, `MiB`,
/// `GiB`, `TiB`), spaces between allowed; `None` when malformed or over `u64::MAX` bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return None,
    };
    let n: u64 = num.parse().ok()?;
    n.checked_mul(1u64 << shift)
}

/// An `allow_private` entry: a CIDR without host bits, or a single address (= /32 or /128).
pub fn parse_private(text: &str) -> Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        if net.trunc() != net {
            return Err(format!(
                "the CIDR has host bits set; write the network address, {}",
                net.trunc()
            ));
        }
        return Ok(net);
    }
    if let Ok(addr) = text.parse::<std::net::IpAddr>() {
        return Ok(IpNet::from(addr));
    }
    Err("not an IP address or CIDR (e.g. \"127.0.0.2/32\", \"fd00::/8\")".to_owned())
}

/// `[A-Za-z_][A-Za-z0-9_]*`: a name every shell can pass through.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl LayerDoc {
    /// The evaluator's view of this layer. The daemon calls this on documents it received, so
    /// entries are parsed again here rather than trusted.
    pub fn to_policy_layer(&self) -> Result<PolicyLayer, ConfigError> {
        let parse = |list: &[String], kind: EntryKind| -> Result<Vec<Entry>, ConfigError> {
            list.iter()
                .map(|t| {
                    Entry::parse(t, kind).map_err(|e| ConfigError::Entry {
                        file: self.name.clone(),
                        entry: t.clone(),
                        reason: e.to_string(),
                    })
                })
                .collect()
        };
        for net in &self.network.allow_private {
            if net.trunc() != *net {
                return Err(ConfigError::Entry {
                    file: self.name.clone(),
                    entry: net.to_string(),
                    reason: "allow_private CIDR has host bits set".to_owned(),
                });
            }
        }
        Ok(PolicyLayer {
            kind: self.kind,
            name: self.name.clone(),
            mode: self.network.mode,
            allow: parse(&self.network.allow, EntryKind::Allow)?,
            block: parse(&self.network.block, EntryKind::Block)?,
            allow_private: self.network.allow_private.clone(),
            gates: {
                let hosts = self.gate.hosts.iter().map(|h| (h, Severity::Medium));
                let rules = self.gate.rules.iter().map(|r| (&r.host, r.severity));
                hosts
                    .chain(rules)
                    .map(|(text, severity)| {
                        Entry::parse(text, EntryKind::Block)
                            .map(|entry| GateEntry { entry, severity })
                            .map_err(|e| ConfigError::Entry {
                                file: self.name.clone(),
                                entry: text.clone(),
                                reason: e.to_string(),
                            })
                    })
                    .collect::<Result<_, _>>()?
            },
            gate_commands: self.gate.commands.clone(),
            // Bounded where it is used (`gate::timeout_of`).
            gate_timeout_ms: self.gate.timeout_ms,
            phases: self
                .phases
                .iter()
                .map(|(name, p)| {
                    if !super::phase::is_phase_name(name) {
                        return Err(ConfigError::Entry {
                            file: self.name.clone(),
                            entry: name.clone(),
                            reason: format!(
                                "phase name is not valid: use {}",
                                super::phase::PHASE_NAME_SYNTAX
                            ),
                        });
                    }
                    let lists = crate::policy::PhaseLists {
                        allow: parse(&p.allow, EntryKind::Allow)?,
                        block: parse(&p.block, EntryKind::Block)?,
                    };
                    Ok((name.clone(), lists))
                })
                .collect::<Result<_, ConfigError>>()?,
        })
    }
}

/// `[gate] timeout` as written (`"110s"`, `"5m"`): from 1 s to 1 h, in milliseconds.
fn parse_gate_timeout(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}): write e.g. \"110s\" or \"5m\""))?;
    if d < crate::gate::MIN_TIMEOUT || d > crate::gate::MAX_TIMEOUT {
        return Err(format!("{s:?} is outside 1s..1h"));
    }
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `[publish] timeout` as written (`"10s"`, `"1m30s"`, `"500ms"`): from 100 ms to 10 minutes, in
/// milliseconds. The bound keeps a dead server from holding the terminal after a session.
fn parse_publish_timeout(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        format!("{s:?} is not a duration ({e}): write e.g. \"10s\", \"1m\" or \"500ms\"")
    })?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if !(100..=600_000).contains(&ms) {
        return Err(format!("{s:?} is outside 100ms..10m"));
    }
    Ok(ms)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const F: &str = "/r/.airlock.toml";

    fn errors(kind: LayerKind, text: &str) -> String {
        match parse_layer(kind, F, text.as_bytes()) {
            Ok(p) => panic!("expected an error, parsed {:?}", p.doc),
            Err(e) => e.to_string(),
        }
    }

    fn repo_err(text: &str) -> String {
        errors(LayerKind::Repo, text)
    }

    #[test]
    fn sandbox_mounts_and_caches_parse_with_their_locations() {
        let text = "[sandbox]\nmounts = [\"~/.cargo/bin:ro\", \"/opt/tools\"]\ncache = [\"cargo\", \"npm\", \"cargo\"]\n";
        let d = parse_layer(LayerKind::User, F, text.as_bytes()).unwrap().doc;
        assert_eq!(d.sandbox.mounts[0].text, "~/.cargo/bin:ro");
        assert_eq!(d.sandbox.mounts[0].at, format!("{F}:2:11"));
        assert_eq!(d.sandbox.mounts[1].at, format!("{F}:2:30"));
        assert_eq!(d.sandbox.cache, ["cargo", "npm"]);
    }

    #[test]
    fn sandbox_backend_is_the_machines_choice_and_a_typo_is_located() {
        let user = parse_layer(
            LayerKind::User,
            "~/.airlock/config.toml",
            b"[sandbox]\nbackend = \"podman\"\n",
        )
        .unwrap()
        .doc;
        assert_eq!(user.sandbox.backend, Some(crate::container::Backend::Podman));
        let e = repo_err("[sandbox]\nbackend = \"docker\"\n");
        assert!(
            e.starts_with(&format!("{F}:2:1: sandbox.backend is not allowed in the repo")),
            "{e}"
        );
        let e = parse_layer(LayerKind::User, "u.toml", b"[sandbox]\nbackend = \"dokcer\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("u.toml:2:11: sandbox.backend: unknown backend \"dokcer\""), "{e}");
    }

    #[test]
    fn sandbox_errors_are_located_with_a_fix() {
        let e = repo_err("[sandbox]\nmounts = [\"tools\"]\n");
        assert!(e.starts_with(&format!("{F}:2:11: mount \"tools\"")), "{e}");
        assert!(e.contains("must be absolute or start with ~/"), "{e}");
        let e = repo_err("[sandbox]\ncache = [\"carg\"]\n");
        assert!(e.starts_with(&format!("{F}:2:10: sandbox.cache has no cache \"carg\"")), "{e}");
        assert!(e.contains("cargo"), "{e}");
        let e = repo_err("[sandbox]\nmount = []\n");
        assert!(e.contains("unknown key `mount` in [sandbox]"), "{e}");
        let e = repo_err("[sandbox]\nmounts = \"/opt\"\n");
        assert!(e.contains("sandbox.mounts must be an array of strings"), "{e}");
    }

    #[test]
    fn a_full_file_parses() {
        let text = r#"
[network]
mode = "allowlist"
allow = ["anthropic.com", "*.githubusercontent.com", "=pypi.org", "git.corp.test:22", "10.1.0.0/16"]
block = ["pastebin.com"]
allow_private = ["127.0.0.2/32", "fd00::1"]

[env]
pass = ["RUST_LOG", "_X1"]

[mcp.github]
GITHUB_TOKEN = { from_env = "GH_TOKEN" }
OTHER = "literal"
"#;
        let p = parse_layer(LayerKind::Repo, F, text.as_bytes()).unwrap();
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        let d = p.doc;
        assert_eq!(d.network.mode, Some(Mode::Allowlist));
        assert_eq!(d.network.allow[1], "*.githubusercontent.com");
        assert_eq!(d.network.block, ["pastebin.com"]);
        assert_eq!(d.network.allow_private[1].to_string(), "fd00::1/128");
        assert_eq!(d.env_pass, ["RUST_LOG", "_X1"]);
        assert_eq!(
            d.mcp["github"]["GITHUB_TOKEN"],
            Credential::FromEnv { from_env: "GH_TOKEN".into() }
        );
        assert_eq!(format!("{:?}", d.mcp["github"]["OTHER"]), "Value(<redacted>)");
        assert_eq!(d.digest, digest(text.as_bytes()));
        // The document survives the trip to the daemon.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<LayerDoc>(&json).unwrap(), d);
        let layer = d.to_policy_layer().unwrap();
        assert_eq!(layer.allow.len(), 5);
        assert_eq!(layer.name, F);
    }

    #[test]
    fn malformed_toml_is_located() {
        let e = repo_err("[network]\nallow = [\"a.com\"\n");
        assert_eq!(
            e,
            "/r/.airlock.toml:2:17: malformed TOML: unclosed array, expected `]`; fix the syntax"
        );
        let e = repo_err("[network]\nmode = \"allowlist\"\nmode = \"blocklist\"\n");
        assert!(e.starts_with("/r/.airlock.toml:3:1: malformed TOML: duplicate key"), "{e}");
    }

    #[test]
    fn not_utf8_is_located() {
        let e = parse_layer(LayerKind::Repo, F, b"[network]\nallow = [\"\xff\"]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/r/.airlock.toml:2:11: the file is not valid UTF-8 (TOML files must be UTF-8); \
             re-save it as UTF-8"
        );
    }

    #[test]
    fn wrong_types_are_located() {
        assert_eq!(
            repo_err("[network]\nallow = \"a.com\"\n"),
            "/r/.airlock.toml:2:9: network.allow must be an array of strings (e.g. network.allow \
             = [\"...\"]), found string"
        );
        assert_eq!(
            repo_err("[network]\nallow = [\"a.com\", 7]\n"),
            "/r/.airlock.toml:2:19: network.allow[1] must be a string, found integer"
        );
        assert_eq!(
            repo_err("network = 1\n"),
            "/r/.airlock.toml:1:11: [network] must be a table, found integer"
        );
        assert_eq!(
            repo_err("[network]\nmode = \"allow\"\n"),
            "/r/.airlock.toml:2:8: network.mode must be \"allowlist\" or \"blocklist\", found \
             \"allow\"; did you mean `allowlist`?"
        );
        assert_eq!(
            repo_err("[mcp.gh]\nTOKEN = 3\n"),
            "/r/.airlock.toml:2:9: mcp.gh.TOKEN must be a string or { from_env = \"VAR\" }, found \
             integer"
        );
    }

    #[test]
    fn unknown_keys_suggest_the_nearest() {
        assert_eq!(
            repo_err("[network]\nalow = [\"a.com\"]\n"),
            "/r/.airlock.toml:2:1: unknown key `alow` in [network]; did you mean `allow`?"
        );
        assert_eq!(
            repo_err("[netwrk]\nallow = []\n"),
            "/r/.airlock.toml:1:2: unknown key `netwrk` in the top level; did you mean `network`?"
        );
        assert_eq!(
            repo_err("[env]\npas = []\n"),
            "/r/.airlock.toml:2:1: unknown key `pas` in [env]; did you mean `pass`?"
        );
        assert_eq!(
            repo_err("[mcp.gh]\nT = { from_evn = \"X\" }\n"),
            "/r/.airlock.toml:2:7: unknown key `from_evn` in mcp.gh.T; did you mean `from_env`?\n\
             /r/.airlock.toml:2:5: mcp.gh.T must be a string or { from_env = \"VAR\" }; add from_env"
                .lines()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn invalid_entries_are_located_at_the_entry() {
        let e = repo_err("[network]\nallow = [\"ok.com\", \"a..b\"]\n");
        assert!(e.starts_with("/r/.airlock.toml:2:20: network.allow entry \"a..b\": "), "{e}");
        let e = repo_err("[network]\nblock = [\"-bad.com\"]\n");
        assert!(e.starts_with("/r/.airlock.toml:2:10: network.block entry \"-bad.com\": "), "{e}");
        let e = repo_err("[network]\nallow = [\"10.0.0.1/8\"]\n");
        assert!(
            e.starts_with("/r/.airlock.toml:2:10: network.allow entry \"10.0.0.1/8\": "),
            "{e}"
        );
        assert!(e.contains("host bits"), "{e}");
        for port in ["0", "65536", "99999"] {
            let e = repo_err(&format!("[network]\nallow = [\"a.com:{port}\"]\n"));
            assert!(e.starts_with("/r/.airlock.toml:2:10: network.allow entry "), "{e}");
            assert!(e.contains("port"), "{e}");
        }
    }

    #[test]
    fn allow_private_needs_network_addresses() {
        assert_eq!(
            repo_err("[network]\nallow_private = [\"10.0.0.1/8\"]\n"),
            "/r/.airlock.toml:2:18: network.allow_private entry \"10.0.0.1/8\": the CIDR has host \
             bits set; write the network address, 10.0.0.0/8"
        );
        let e = repo_err("[network]\nallow_private = [\"localhost\"]\n");
        assert!(e.starts_with("/r/.airlock.toml:2:18: network.allow_private entry"), "{e}");
    }

    #[test]
    fn review_is_for_managed_and_user_layers_only() {
        let text = "[review]\nservers = [\"https://review.corp.test\"]\n";
        assert_eq!(
            repo_err(text),
            "/r/.airlock.toml:1:2: [review] is not allowed in the repo layer: review-plane \
             servers may be set only in the managed layer (/etc/airlock/policy.toml) or the user \
             layer (~/.airlock/config.toml); move it there"
        );
        assert!(errors(LayerKind::Operator, text).contains("not allowed in the operator layer"));
        for kind in [LayerKind::Managed, LayerKind::User] {
            let p = parse_layer(kind, F, text.as_bytes()).unwrap();
            assert_eq!(p.doc.review_servers, ["https://review.corp.test"]);
        }
        let e = errors(LayerKind::User, "[review]\nservers = [\"ftp://x.test\"]\n");
        assert!(
            e.starts_with("/r/.airlock.toml:2:12: review.servers entry \"ftp://x.test\""),
            "{e}"
        );
    }

    #[test]
    fn logs_keep_is_for_managed_and_user_layers_only() {
        assert_eq!(
            repo_err("[network]\nallow = [\"a.test\"]\n[logs]\nkeep = \"1d\"\n"),
            "/r/.airlock.toml:3:2: [logs] is not allowed in the repo layer: log retention may \
             only be set in ~/.airlock/config.toml or the managed policy \
             (/etc/airlock/policy.toml), so a repo cannot erase its own audit trail; move it there"
        );
        for kind in [LayerKind::Managed, LayerKind::User] {
            let doc = parse_layer(kind, F, b"[logs]\nkeep = \"90d\"\n").unwrap().doc;
            assert_eq!(doc.logs, LogsDoc { keep_secs: Some(90 * 86_400) });
        }
        let user = |t: &str| errors(LayerKind::User, t);
        assert_eq!(
            user("[logs]\nkeep = \"soon\"\n"),
            "/r/.airlock.toml:2:8: logs.keep: \"soon\" is not a retention period: write a whole \
             number of days or hours, like \"90d\" or \"36h\""
        );
        assert_eq!(
            user("[logs]\nkeep = 90\n"),
            "/r/.airlock.toml:2:8: logs.keep must be a string like \"90d\" or \"36h\", found integer"
        );
        assert_eq!(
            user("[logs]\nkepe = \"1d\"\n"),
            "/r/.airlock.toml:2:1: unknown key `kepe` in [logs]; did you mean `keep`?"
        );
    }

    #[test]
    fn gates_parse_in_every_layer_and_become_policy_gates() {
        let text = "[network]\nallow = [\"pay.test\"]\n[gate]\nhosts = [\"pay.test\", \"=db.test:5432\"]\n\
                    timeout = \"30s\"\n[[gate.rule]]\nhost = \"api.pay.test\"\nseverity = \"high\"\n";
        for kind in [LayerKind::Managed, LayerKind::User, LayerKind::Repo, LayerKind::Operator] {
            let d = parse_layer(kind, F, text.as_bytes()).unwrap().doc;
            assert_eq!(d.gate.hosts, ["pay.test", "=db.test:5432"]);
            assert_eq!(
                d.gate.rules,
                [GateRuleDoc { host: "api.pay.test".into(), severity: Severity::High }]
            );
            assert_eq!(d.gate.timeout_ms, Some(30_000));
            let l = d.to_policy_layer().unwrap();
            let gates: Vec<_> = l.gates.iter().map(|g| (g.entry.text(), g.severity)).collect();
            assert_eq!(
                gates,
                [
                    ("pay.test", Severity::Medium),
                    ("=db.test:5432", Severity::Medium),
                    ("api.pay.test", Severity::High)
                ]
            );
            assert_eq!(l.gate_timeout_ms, Some(30_000));
        }
    }

    #[test]
    fn gate_errors_are_located_with_a_fix() {
        let e = repo_err("[gate]\nhosts = [\"bad host\"]\n");
        assert!(
            e.contains(&format!("{F}:2:10")) && e.contains("gate.hosts entry \"bad host\""),
            "{e}"
        );
        let e = repo_err("[gate]\ntimeout = \"2h\"\n");
        assert!(e.contains(&format!("{F}:2:11")) && e.contains("outside 1s..1h"), "{e}");
        let e = repo_err("[gate]\ntimeout = 5\n");
        assert!(e.contains("gate.timeout must be a string like \"110s\""), "{e}");
        let e = repo_err("[[gate.rule]]\nhost = \"pay.test\"\nseverity = \"hgh\"\n");
        assert!(e.contains(&format!("{F}:3:12")) && e.contains("\"high\""), "{e}");
        let e = repo_err("[[gate.rule]]\nseverity = \"low\"\n");
        assert!(e.contains(&format!("{F}:1:1")) && e.contains("needs `host"), "{e}");
        let e = repo_err("[[gate.rule]]\nhost = \"pay.test\"\nsevrity = \"low\"\n");
        assert!(
            e.contains("unknown key `sevrity` in [[gate.rule]]") && e.contains("severity"),
            "{e}"
        );
        let e = repo_err("[gate]\nhost = [\"pay.test\"]\n");
        assert!(e.contains("unknown key `host` in [gate]") && e.contains("hosts"), "{e}");
        let e = repo_err("[gate]\nrule = \"x\"\n");
        assert!(e.contains("gate.rule must be an array of tables"), "{e}");
        let e = repo_err("[gate]\ncommands = [\"git push*\", \"*\"]\n");
        assert!(e.contains(&format!("{F}:2:26")) && e.contains("matches every command"), "{e}");
        let d =
            parse_layer(LayerKind::Repo, F, b"[gate]\ncommands = [\"git push*\"]\n").unwrap().doc;
        assert_eq!(d.gate.commands, ["git push*"]);
        assert_eq!(d.to_policy_layer().unwrap().gate_commands, ["git push*"]);
    }

    #[test]
    fn publish_is_for_managed_and_user_layers_only() {
        let e = repo_err("[publish]\nauto = true\n");
        assert!(
            e.starts_with("/r/.airlock.toml:1:2: [publish] is not allowed in the repo layer"),
            "{e}"
        );
        for kind in [LayerKind::Managed, LayerKind::User] {
            let doc =
                parse_layer(kind, F, b"[publish]\nauto = true\ntimeout = \"2s\"\n").unwrap().doc;
            assert_eq!(doc.publish, PublishDoc { auto: Some(true), timeout_ms: Some(2000) });
        }
        let user = |t: &str| errors(LayerKind::User, t);
        assert_eq!(
            user("[publish]\nauto = \"yes\"\n"),
            "/r/.airlock.toml:2:8: publish.auto must be true or false, found string"
        );
        assert_eq!(
            user("[publish]\ntimeout = 10\n"),
            "/r/.airlock.toml:2:11: publish.timeout must be a string like \"10s\" or \"1m\", \
             found integer"
        );
        let e = user("[publish]\ntimeout = \"1h\"\n");
        assert!(e.contains("publish.timeout: \"1h\" is outside 100ms..10m"), "{e}");
        let e = user("[publish]\ntimeout = \"soon\"\n");
        assert!(
            e.starts_with("/r/.airlock.toml:2:11: publish.timeout: \"soon\" is not a duration"),
            "{e}"
        );
        assert_eq!(
            user("[publish]\nato = true\n"),
            "/r/.airlock.toml:2:1: unknown key `ato` in [publish]; did you mean `auto`?"
        );
    }

    #[test]
    fn audit_is_for_managed_and_user_layers_only_and_sizes_parse() {
        assert_eq!(
            repo_err("[network]\nallow = [\"a.test\"]\n[audit]\nburst = 5\n"),
            "/r/.airlock.toml:3:2: [audit] is not allowed in the repo layer: the audit log's \
             bounds may only be set in ~/.airlock/config.toml or the managed policy \
             (/etc/airlock/policy.toml), so a repo cannot quiet or fill its own audit trail; \
             move it there"
        );
        assert!(
            repo_err("audit.burst = 5\n")
                .starts_with("/r/.airlock.toml:1:1: [audit] is not allowed in the repo layer")
        );
        let text = b"[audit]\nburst = 7\nsession_budget = \"512MiB\"\nmin_free = 1048576\n";
        for kind in [LayerKind::Managed, LayerKind::User] {
            let doc = parse_layer(kind, F, text).unwrap().doc;
            let want = AuditDoc {
                burst: Some(7),
                session_budget: Some(512 << 20),
                min_free: Some(1 << 20),
            };
            assert_eq!(doc.audit, want);
        }
        let user = |t: &str| errors(LayerKind::User, t);
        assert_eq!(
            user("[audit]\nmin_free = \"12MB\"\n"),
            "/r/.airlock.toml:2:12: audit.min_free must be a size like \"512MiB\" (units B, KiB, \
             MiB, GiB, TiB) or a number of bytes, found \"12MB\""
        );
        assert_eq!(
            user("[audit]\nburst = -1\n"),
            "/r/.airlock.toml:2:9: audit.burst must be a whole number from 0 to 4294967295, found \
             -1; 0 turns the rate limit off"
        );
        assert_eq!(
            user("[audit]\nbrust = 1\n"),
            "/r/.airlock.toml:2:1: unknown key `brust` in [audit]; did you mean `burst`?"
        );
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_size("7"), Some(7));
        assert_eq!(parse_size("16777216TiB"), None);
        assert_eq!(parse_size("MiB"), None);
    }

    #[test]
    fn terminal_is_for_managed_and_user_layers_only() {
        let text = "[network]\nallow = [\"a.test\"]\n[terminal]\nclipboard = \"allow\"\n";
        assert_eq!(
            repo_err(text),
            "/r/.airlock.toml:3:2: [terminal] is not allowed in the repo layer: it may only be set \
             in ~/.airlock/config.toml or the managed policy (/etc/airlock/policy.toml), so a repo \
             cannot open your clipboard to its agent; move it there"
        );
        assert!(
            repo_err("terminal.clipboard = \"deny\"\n")
                .starts_with("/r/.airlock.toml:1:1: [terminal] is not allowed in the repo layer")
        );
        assert!(errors(LayerKind::Operator, text).contains("not allowed in the operator layer"));
        for kind in [LayerKind::Managed, LayerKind::User] {
            let doc = parse_layer(kind, F, text.as_bytes()).unwrap().doc;
            assert_eq!(doc.terminal.clipboard, Some(Clipboard::Allow));
            let doc = parse_layer(kind, F, b"[terminal]\nclipboard = \"deny\"\n").unwrap().doc;
            assert_eq!(doc.terminal.clipboard, Some(Clipboard::Deny));
            let json = serde_json::to_string(&doc).unwrap();
            assert_eq!(serde_json::from_str::<LayerDoc>(&json).unwrap(), doc);
        }
        let user = |text: &str| errors(LayerKind::User, text);
        assert_eq!(
            user("[terminal]\nclipbaord = \"allow\"\n"),
            "/r/.airlock.toml:2:1: unknown key `clipbaord` in [terminal]; did you mean `clipboard`?"
        );
        assert_eq!(
            user("[terminal]\nclipboard = \"alow\"\n"),
            "/r/.airlock.toml:2:13: terminal.clipboard must be \"deny\" or \"allow\", found \
             \"alow\"; did you mean `allow`?"
        );
        assert_eq!(
            user("[terminal]\nclipboard = true\n"),
            "/r/.airlock.toml:2:13: terminal.clipboard must be a string, found boolean"
        );
        assert_eq!(
            user("[termnal]\n"),
            "/r/.airlock.toml:1:2: unknown key `termnal` in the top level; did you mean `terminal`?"
        );
    }

    #[test]
    fn env_names_are_checked() {
        assert!(
            repo_err("[env]\npass = [\"A-B\"]\n")
                .starts_with("/r/.airlock.toml:2:9: env.pass entry \"A-B\" is not an environment")
        );
        assert!(repo_err("[mcp.x]\n1A = \"v\"\n").starts_with("/r/.airlock.toml:2:1: [mcp.x] key"));
    }

    #[test]
    fn every_error_is_reported_in_file_order_and_nothing_is_returned() {
        let e = repo_err("[network]\nmode = 1\nalow = []\nblock = [\"\"]\n");
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 3, "{e}");
        assert!(lines[0].starts_with("/r/.airlock.toml:2:"));
        assert!(lines[1].starts_with("/r/.airlock.toml:3:"));
        assert!(lines[2].starts_with("/r/.airlock.toml:4:"));
    }

    #[test]
    fn duplicates_and_overlaps_warn() {
        let text = "[network]\nallow = [\"a.com\", \"A.com.\", \"b.com\"]\nblock = [\"b.com\"]\n";
        let p = parse_layer(LayerKind::Repo, F, text.as_bytes()).unwrap();
        let w: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            w,
            [
                "/r/.airlock.toml:2:19: warning: \"A.com.\" is listed twice in network.allow \
                 (first at line 2); remove one",
                "/r/.airlock.toml:3:10: warning: \"b.com\" is in both network.allow (line 2) and \
                 network.block; block wins, so the allow entry has no effect",
            ]
        );
        // A block on one port does not cover an allow entry's default ports.
        let text = "[network]\nallow = [\"b.com\"]\nblock = [\"b.com:22\"]\n";
        assert!(parse_layer(LayerKind::Repo, F, text.as_bytes()).unwrap().warnings.is_empty());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes: either a document or errors, never a panic, and every error is located
        /// inside the file.
        #[test]
        fn arbitrary_input_is_located_or_accepted(text in "(\\PC|\n|\\[|\\]|=|\"){0,200}") {
            let lines = text.split('\n').count();
            match parse_layer(LayerKind::Repo, "f", text.as_bytes()) {
                Ok(_) => {}
                Err(ConfigError::Invalid(diags)) => {
                    prop_assert!(!diags.is_empty());
                    for d in diags {
                        prop_assert!(d.line >= 1 && d.line <= lines, "{d}");
                        prop_assert!(d.col >= 1, "{d}");
                        prop_assert!(d.to_string().starts_with("f:"));
                    }
                }
                Err(other) => prop_assert!(false, "unexpected error kind {other}"),
            }
        }

        /// Structured but random network sections: valid entries round-trip as written; an
        /// invalid one anywhere rejects the whole file.
        #[test]
        fn entries_round_trip_or_reject_the_file(
            names in proptest::collection::vec("[a-z]{1,8}(\\.[a-z]{1,8}){0,2}", 0..6),
            prefix in proptest::sample::select(vec!["", "*.", "="]),
            port in proptest::option::of(0u32..70000),
        ) {
            let entries: Vec<String> = names
                .iter()
                .map(|n| match port {
                    Some(p) => format!("{prefix}{n}:{p}"),
                    None => format!("{prefix}{n}"),
                })
                .collect();
            let text = format!("[network]\nblock = {}\n", toml_array(&entries));
            let result = parse_layer(LayerKind::User, "f", text.as_bytes());
            let bad_port = matches!(port, Some(p) if p == 0 || p > 65535);
            if bad_port && !entries.is_empty() {
                let err = result.unwrap_err().to_string();
                prop_assert!(err.starts_with("f:2:"), "{err}");
                prop_assert_eq!(err.lines().count(), entries.len());
            } else {
                let doc = result.unwrap().doc;
                prop_assert_eq!(doc.network.block, entries);
            }
        }
    }

    fn toml_array(items: &[String]) -> String {
        let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", quoted.join(", "))
    }
}
