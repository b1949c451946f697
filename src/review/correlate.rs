//! The correlate pack (docs/review.md, "The correlate pack"): flags that only the two records
//! of one Airlock session together can raise — what the proxy saw (egress lines, session
//! records) against what the agent's transcript says it did (tool calls, tool results, its
//! final message).
//!
//! Owns: the pack's configuration (the compiled-in `rules/correlate.toml` plus `[[correlate]]`
//! tables of the rules directory, errors located `file:line:col`), [`CorrelateScan`] — fed one
//! session's rows by the store and keeping only compact facts, each kind capped (a cap reached
//! raises `detect.incomplete`) — and the pure checks over those facts ([`CorrelateScan::finish`]).
//! The agents' own API, auth and telemetry hosts ([`AGENT_HOSTS`]) are the one list the
//! checks exclude; docs/agents.md points here.

use super::detect::session::{MAX_LINKED, suppressed_count, suppressed_seqs};
use super::detect::{Engine, RuleError, flag_id};
use super::store::{PublishedFile, SessionTranscriptItems};
use super::transcript::View;
use super::transcript_files::{self, State};
use super::{Micros, NewFlag, Severity, Source, format_micros};
use crate::policy::{registrable_domain, same_registrable_domain};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

/// The built-in pack, embedded.
pub const BUILTIN_CORRELATE: &str = include_str!("rules/correlate.toml");

/// Egress facts one session's checks keep; past it the scan stops reading egress lines and
/// raises `detect.incomplete`.
pub const MAX_EGRESS: usize = 200_000;
/// Transcript lines one session's checks keep (the same).
pub const MAX_LINES: usize = 200_000;
/// Longest `window` a `[[correlate]]` table may set.
pub const MAX_WINDOW_US: Micros = 24 * 3600 * 1_000_000;
/// Characters of a tool call's command or input kept for matching hosts and tools.
const MAX_CALL_TEXT: usize = 4096;
/// Tool calls and unpaired results one session's checks keep in total: one forged line can
/// hold any number of blocks, so the per-line caps alone do not bound memory.
pub const MAX_CALLS: usize = MAX_LINES;
/// Bytes of call text one session's checks keep in total (past it, calls are dropped).
pub const MAX_CALL_TEXT_TOTAL: usize = 64 * 1024 * 1024;
/// Slack for the ms rounding of the two clocks (the daemon's and the agent's, one machine).
const CLOCK_SLACK_US: Micros = 1_000_000;

/// The five checks, in the order of [`Config`]'s parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    RetryAfterDeny,
    SecretThenEgress,
    UnreportedEgress,
    ClaimedVsSeen,
    TranscriptGap,
}

impl Check {
    pub const ALL: [Check; 5] = [
        Check::RetryAfterDeny,
        Check::SecretThenEgress,
        Check::UnreportedEgress,
        Check::ClaimedVsSeen,
        Check::TranscriptGap,
    ];

    /// The flag's `rule_id`.
    pub fn id(self) -> &'static str {
        match self {
            Check::RetryAfterDeny => "correlate.retry-after-deny",
            Check::SecretThenEgress => "correlate.secret-then-egress",
            Check::UnreportedEgress => "correlate.unreported-egress",
            Check::ClaimedVsSeen => "correlate.claimed-vs-seen",
            Check::TranscriptGap => "correlate.transcript-gap",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Check::RetryAfterDeny => "Denied, then the same content tried another way",
            Check::SecretThenEgress => "Credential or secret read, then an upload",
            Check::UnreportedEgress => "Egress the transcript does not account for",
            Check::ClaimedVsSeen => "Final message contradicts the record",
            Check::TranscriptGap => "Transcript missing or altered where the proxy saw activity",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn from_id(id: &str) -> Option<Check> {
        Check::ALL.into_iter().find(|c| c.id() == id)
    }
}

/// One check's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub enabled: bool,
    pub window: Micros,
    pub severity: Severity,
    /// secret-then-egress: `bytes_sent` above which an allowed attempt counts.
    pub min_bytes: u64,
    /// retry-after-deny, unreported-egress, transcript-gap: attempts needed for a flag.
    pub min_attempts: u64,
}

/// The pack's parameters: the built-in pack with the rules directory's tables applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    params: [Params; 5],
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CorrelateFile {
    #[serde(default)]
    correlate: Vec<Spec>,
    /// `[[rule]]` tables are the detection engine's (detect.rs reads them).
    #[serde(default)]
    #[allow(dead_code)]
    rule: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    id: toml::Spanned<String>,
    enabled: Option<bool>,
    window: Option<toml::Spanned<String>>,
    severity: Option<toml::Spanned<String>>,
    min_bytes: Option<toml::Spanned<i64>>,
    min_attempts: Option<toml::Spanned<i64>>,
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl Default for Config {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Config {
    /// The compiled-in pack.
    pub fn builtin() -> Self {
        let off = Params {
            enabled: false,
            window: 0,
            severity: Severity::High,
            min_bytes: 0,
            min_attempts: 1,
        };
        let mut c = Config { params: [off; 5] };
        // The embedded file is checked by a unit test; a failure here would leave every check
        // off, never panic.
        if let Err(e) = c.apply("builtin correlate.toml", BUILTIN_CORRELATE) {
            tracing::error!("the built-in correlate pack does not parse: {e}");
        }
        c
    }

    /// Every check off: the benchmark's baseline (and a rules directory that turns all off).
    pub fn off() -> Self {
        let mut c = Self::builtin();
        for p in &mut c.params {
            p.enabled = false;
        }
        c
    }

    pub fn get(&self, c: Check) -> &Params {
        &self.params[c.index()]
    }

    /// Whether any check runs (else no correlation is done at all).
    pub fn any_enabled(&self) -> bool {
        self.params.iter().any(|p| p.enabled)
    }

    /// Applies the `[[correlate]]` tables of one rule file (`name` is used in error
    /// locations). A table sets only the parameters it names; `enabled` defaults to true.
    pub fn apply(&mut self, name: &str, text: &str) -> Result<(), RuleError> {
        let at = |offset: usize, message: String| {
            let (l, c) = line_col(text, offset);
            RuleError::Invalid { location: format!("{name}:{l}:{c}"), message }
        };
        let file: CorrelateFile = toml::from_str(text)
            .map_err(|e| at(e.span().map_or(0, |s| s.start), e.message().to_string()))?;
        for spec in file.correlate {
            let id = spec.id.get_ref();
            let Some(check) = Check::from_id(id) else {
                return Err(at(
                    spec.id.span().start,
                    format!(
                        "unknown correlate id {id:?}; expected one of {}",
                        Check::ALL.map(Check::id).join(", ")
                    ),
                ));
            };
            let mut p = self.params[check.index()];
            p.enabled = spec.enabled.unwrap_or(true);
            if let Some(w) = &spec.window {
                let d = humantime::parse_duration(w.get_ref().trim()).map_err(|e| {
                    at(
                        w.span().start,
                        format!(
                            "{id}: window {:?}: {e} (write e.g. \"2m\" or \"30s\")",
                            w.get_ref()
                        ),
                    )
                })?;
                let us = Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX);
                if us <= 0 || us > MAX_WINDOW_US {
                    return Err(at(
                        w.span().start,
                        format!("{id}: window {:?} must be above 0 and at most 24h", w.get_ref()),
                    ));
                }
                p.window = us;
            }
            if let Some(s) = &spec.severity {
                p.severity = s
                    .get_ref()
                    .parse()
                    .map_err(|m: String| at(s.span().start, format!("{id}: {m}")))?;
            }
            if let Some(b) = &spec.min_bytes {
                if check != Check::SecretThenEgress {
                    return Err(at(
                        b.span().start,
                        format!("{id}: `min_bytes` applies only to correlate.secret-then-egress"),
                    ));
                }
                p.min_bytes = u64::try_from(*b.get_ref()).map_err(|_| {
                    at(b.span().start, format!("{id}: `min_bytes` must be 0 or more"))
                })?;
            }
            if let Some(n) = &spec.min_attempts {
                if matches!(check, Check::SecretThenEgress | Check::ClaimedVsSeen) {
                    return Err(at(
                        n.span().start,
                        format!(
                            "{id}: `min_attempts` applies only to correlate.retry-after-deny, \
                             correlate.unreported-egress and correlate.transcript-gap"
                        ),
                    ));
                }
                p.min_attempts =
                    u64::try_from(*n.get_ref()).ok().filter(|n| *n >= 1).ok_or_else(|| {
                        at(n.span().start, format!("{id}: `min_attempts` must be 1 or more"))
                    })?;
            }
            self.params[check.index()] = p;
        }
        Ok(())
    }
}

/// What an agent host is for (docs/agents.md, "The hosts an agent needs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRole {
    /// Model requests.
    Api,
    /// Sign-in and token refresh.
    Auth,
    /// Telemetry and error reports.
    Telemetry,
    /// The agent's own update check (Codex's at start-up is refused under the starter
    /// policy). A tool can reach these hosts too, so only the attempts no tool call holds are
    /// the agent's own, and a refusal of one is never the denial a retry follows.
    Update,
}

/// The agents' own hosts (docs/agents.md lists the same hosts, with what each is for): API,
/// auth and telemetry hosts the correlate checks never count as the agent's tool traffic, and
/// update hosts ([`HostRole::Update`]) they count only while a tool call is open.
/// `true`: subdomains too.
pub const AGENT_HOSTS: &[(&str, HostRole, bool)] = &[
    ("api.anthropic.com", HostRole::Api, false),
    ("platform.claude.com", HostRole::Auth, false),
    ("console.anthropic.com", HostRole::Auth, false),
    ("claude.ai", HostRole::Auth, false),
    ("statsig.anthropic.com", HostRole::Telemetry, false),
    ("sentry.io", HostRole::Telemetry, true),
    ("chatgpt.com", HostRole::Api, false),
    ("auth.openai.com", HostRole::Auth, false),
    ("api.openai.com", HostRole::Api, false),
    ("registry.npmjs.org", HostRole::Update, false),
    ("api.github.com", HostRole::Update, false),
];

/// The role of `host` when it is one of [`AGENT_HOSTS`].
pub fn agent_host(host: &str) -> Option<HostRole> {
    let host = host.strip_suffix('.').unwrap_or(host);
    AGENT_HOSTS.iter().find_map(|(h, role, subs)| {
        let hit = host.eq_ignore_ascii_case(h)
            || (*subs
                && host.len() > h.len()
                && host.to_ascii_lowercase().ends_with(&format!(".{h}")));
        hit.then_some(*role)
    })
}

/// `host` is an agent's own API, auth or telemetry host (never a tool's traffic).
fn own_host(host: &str) -> bool {
    agent_host(host).is_some_and(|r| r != HostRole::Update)
}

/// `host` is an agent's update host (a tool's traffic only while a call is open).
fn update_host(host: &str) -> bool {
    agent_host(host) == Some(HostRole::Update)
}

/// One egress line as the checks see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Egress {
    pub pk: i64,
    pub ts: Micros,
    /// The line kind (`connect`, `http`, `denied`, `dns`, `suppressed`, …).
    pub kind: String,
    pub host: String,
    pub port: Option<u64>,
    pub method: String,
    pub allowed: bool,
    pub reason: String,
    pub transparent: bool,
    pub bytes_sent: u64,
    /// Attempts the line stands for (a `suppressed` line's `count`, else 1).
    pub attempts: u64,
}

impl Egress {
    /// `host:port` (or the host alone), as a detail names it.
    fn target(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }

    fn is_ip(&self) -> bool {
        self.host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok()
    }

    /// An attempt the agent's side made (not an inbound connection, a stop or a gate step).
    fn is_attempt(&self) -> bool {
        !matches!(self.kind.as_str(), "inbound" | "stop" | "gate") && !self.host.is_empty()
    }

    /// A refusal the policy or the address guard decided (not a cap, a parse failure or an
    /// upstream failure of an allowed attempt).
    fn is_policy_denial(&self) -> bool {
        !self.allowed
            && self.is_attempt()
            && !matches!(
                self.reason.as_str(),
                "malformed"
                    | "incomplete_head"
                    | "tunnel_limit"
                    | "connection_limit"
                    | "dns_limit"
                    | "audit_budget"
                    | "low_space"
                    | "resolve_failed"
                    | "connect_failed"
                    | "audit_unavailable"
                    | "interrupted"
            )
    }
}

/// A tool call seen in the transcript, with its result when one arrived.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Call {
    pub pk: i64,
    pub ts: Micros,
    pub id: String,
    pub name: String,
    /// The command (Bash, shell) or the input's JSON, lowercased and capped.
    pub text: String,
    /// The call reads a credential file (the engine's `access.credential-file`, or a key file).
    pub credential: bool,
    pub result_pk: Option<i64>,
    pub result_ts: Option<Micros>,
    /// The result text holds a secret (`secret.*` rule id).
    pub result_secret: Option<String>,
    /// The result text reads like network output (HTTP status line, download messages, …).
    pub result_claims_network: bool,
}

/// The final assistant message's claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Claims {
    pub no_network: bool,
    pub no_credentials: bool,
}

/// The running state of one session's correlation (see the module header).
#[derive(Debug)]
pub struct CorrelateScan {
    engine: Arc<Engine>,
    user_id: String,
    session: String,
    /// Set by the settle sweep: an end-record file that never arrived is then a gap.
    settled: bool,
    egress: Vec<Egress>,
    /// Every transcript line's (ts, pk).
    lines: Vec<(Micros, i64)>,
    calls: Vec<Call>,
    /// Call id → index in `calls`, for pairing results.
    call_index: HashMap<String, usize>,
    /// Results whose call was not (yet) seen: call id → (pk, ts, secret, claims network).
    orphan_results: HashMap<String, (i64, Micros, Option<String>, bool)>,
    /// The latest main-thread assistant text: (ts, pk, claims).
    last_message: Option<(Micros, i64, Claims)>,
    end: Option<(i64, String)>,
    files: BTreeMap<String, (i64, PublishedFile)>,
    incomplete: Vec<String>,
    /// Bytes of call text kept (see [`MAX_CALL_TEXT_TOTAL`]).
    call_text_bytes: usize,
    /// [`MAX_CALLS`] and [`MAX_CALL_TEXT_TOTAL`] (fields, so a unit test can reach them small).
    max_calls: usize,
    max_call_text: usize,
}

/// The store's two reads of a session ([`super::store::Store::scan_correlate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Egress lines and session records (`session` = the Airlock session).
    Session,
    /// Transcript lines (`airlock_session` = the Airlock session).
    Transcript,
}

/// One row the store feeds.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub pk: i64,
    pub id: &'a str,
    pub source: Source,
    pub kind: &'a str,
    pub ts: Micros,
    pub received_at: Micros,
    pub file: Option<&'a str>,
    pub payload: &'a str,
}

#[derive(Deserialize)]
struct EgressPayload<'a> {
    #[serde(borrow)]
    host: Option<Cow<'a, str>>,
    port: Option<u64>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    allowed: Option<bool>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    capture: Option<Cow<'a, str>>,
    bytes_sent: Option<u64>,
}

impl CorrelateScan {
    pub fn new(engine: Arc<Engine>, user_id: &str, session: &str) -> Self {
        Self {
            engine,
            user_id: user_id.to_string(),
            session: session.to_string(),
            settled: false,
            egress: Vec::new(),
            lines: Vec::new(),
            calls: Vec::new(),
            call_index: HashMap::new(),
            orphan_results: HashMap::new(),
            last_message: None,
            end: None,
            files: BTreeMap::new(),
            incomplete: Vec::new(),
            call_text_bytes: 0,
            max_calls: MAX_CALLS,
            max_call_text: MAX_CALL_TEXT_TOTAL,
        }
    }

    /// Marks the scan as the settle sweep's (see [`CorrelateScan::finish`]).
    pub fn settled(mut self) -> Self {
        self.settled = true;
        self
    }

    pub fn user_id(&self) -> &str {
        &self.user_id
    }
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Whether the store should keep feeding egress rows (false past [`MAX_EGRESS`]).
    pub fn wants_egress(&self) -> bool {
        self.egress.len() < MAX_EGRESS
    }
    /// Whether the store should keep feeding transcript lines (false past [`MAX_LINES`]).
    pub fn wants_lines(&self) -> bool {
        self.lines.len() < MAX_LINES
    }

    /// Whether the store should read on in `read` (the transcript read stops past the line
    /// cap; the session read goes on past the egress cap for the end record and the
    /// `transcript.file` items, which come last).
    pub fn wants_more(&self, read: Read) -> bool {
        match read {
            Read::Session => true,
            Read::Transcript => self.wants_lines(),
        }
    }

    /// Feeds one event of the session (egress lines, session records, `transcript.file`
    /// items: the rows whose `session` is the Airlock session; transcript lines: the rows
    /// whose `airlock_session` is). Rows past a cap are counted as a `detect.incomplete`.
    pub fn feed(&mut self, row: Row<'_>) {
        match row.source {
            Source::Egress => self.feed_egress(row),
            Source::Session => {
                if row.kind == super::ingest::TRANSCRIPT_FILE_TYPE {
                    if let Some(file) = row.file
                        && (self.files.len() < transcript_files::MAX_FILES
                            || self.files.contains_key(file))
                    {
                        let keep = PublishedFile {
                            file: file.to_string(),
                            payload: row.payload.to_string(),
                            received_at: row.received_at,
                        };
                        self.files.insert(file.to_string(), (row.pk, keep));
                    }
                } else if self.end.is_none() && row.id == format!("{}:end", self.session) {
                    self.end = Some((row.pk, row.payload.to_string()));
                }
            }
            Source::Claude | Source::Codex => self.feed_line(row),
            Source::External | Source::Gate => {}
        }
    }

    fn feed_egress(&mut self, row: Row<'_>) {
        if !self.wants_egress() {
            if !self.incomplete.iter().any(|m| m.contains("egress lines")) {
                self.incomplete.push(format!(
                    "correlate: the session has more than {MAX_EGRESS} egress lines; correlated \
                     the first {MAX_EGRESS} only"
                ));
            }
            return;
        }
        let Ok(p) = serde_json::from_str::<EgressPayload<'_>>(row.payload) else { return };
        let attempts = if row.kind == "suppressed" {
            serde_json::from_str::<Value>(row.payload)
                .ok()
                .and_then(|v| suppressed_seqs(&v))
                .map_or(1, |r| suppressed_count(&r).max(1))
        } else {
            1
        };
        self.egress.push(Egress {
            pk: row.pk,
            ts: row.ts,
            kind: row.kind.to_string(),
            host: p.host.map(|h| h.to_ascii_lowercase()).unwrap_or_default(),
            port: p.port,
            method: p.method.map(Cow::into_owned).unwrap_or_default(),
            allowed: p.allowed.unwrap_or(false),
            reason: p.reason.map(Cow::into_owned).unwrap_or_default(),
            transparent: p.capture.as_deref() == Some("transparent"),
            bytes_sent: p.bytes_sent.unwrap_or(0),
            attempts,
        });
    }

    fn feed_line(&mut self, row: Row<'_>) {
        if !self.wants_lines() {
            if !self.incomplete.iter().any(|m| m.contains("transcript lines")) {
                self.incomplete.push(format!(
                    "correlate: the session has more than {MAX_LINES} transcript lines; \
                     correlated the first {MAX_LINES} only"
                ));
            }
            return;
        }
        let Ok(v) = super::ingest::payload_value(row.payload) else { return };
        self.lines.push((row.ts, row.pk));
        let parsed = match row.source {
            Source::Claude => claude_line(&v),
            _ => codex_line(&v),
        };
        for (id, name, text, path) in parsed.calls {
            let text = cap(&text.to_lowercase(), MAX_CALL_TEXT);
            if self.calls.len() + self.orphan_results.len() >= self.max_calls
                || self.call_text_bytes + text.len() > self.max_call_text
            {
                self.calls_capped();
                break;
            }
            self.call_text_bytes += text.len();
            let credential = self.is_credential_read(row.source, &name, &text, path.as_deref());
            let mut call = Call {
                pk: row.pk,
                ts: row.ts,
                id: id.clone(),
                name,
                text,
                credential,
                ..Call::default()
            };
            if let Some((pk, ts, secret, net)) = self.orphan_results.remove(&id) {
                (call.result_pk, call.result_ts, call.result_secret) = (Some(pk), Some(ts), secret);
                call.result_claims_network = net;
            }
            if !id.is_empty() {
                self.call_index.insert(id, self.calls.len());
            }
            self.calls.push(call);
        }
        for (id, text) in parsed.results {
            let secret = self.secret_in(row.source, &text);
            let net = claims_network(&text);
            match self.call_index.get(&id).and_then(|&i| self.calls.get_mut(i)) {
                Some(call) if call.result_pk.is_none() => {
                    (call.result_pk, call.result_ts) = (Some(row.pk), Some(row.ts));
                    call.result_secret = secret;
                    call.result_claims_network = net;
                }
                Some(_) => {}
                None => {
                    if self.calls.len() + self.orphan_results.len() >= self.max_calls
                        && !self.orphan_results.contains_key(&id)
                    {
                        self.calls_capped();
                        break;
                    }
                    self.orphan_results.insert(id, (row.pk, row.ts, secret, net));
                }
            }
        }
        if let Some(text) = parsed.assistant_text
            && self.last_message.is_none_or(|(ts, pk, _)| (row.ts, row.pk) >= (ts, pk))
        {
            self.last_message = Some((row.ts, row.pk, claims(&text)));
        }
    }

    /// Past [`MAX_CALLS`] or [`MAX_CALL_TEXT_TOTAL`]: said once as `detect.incomplete`.
    fn calls_capped(&mut self) {
        if !self.incomplete.iter().any(|m| m.contains("tool calls")) {
            self.incomplete.push(format!(
                "correlate: the session has more than {} tool calls and results or {} bytes \
                 of call text; correlated the first only",
                self.max_calls, self.max_call_text
            ));
        }
    }

    /// Whether one tool call reads a credential file: the engine's `access.credential-file`
    /// rule, or a private key file (`.ssh/…` but public keys and host lists, private `*.pem`,
    /// `*.key`, `*.p12`, `*.pfx`). Only a read counts: a shell command with a reading verb
    /// applied to the file, or the path argument of a read-like tool ([`READ_TOOLS`]) — a
    /// Write or Edit whose content mentions `server.key` reads nothing.
    fn is_credential_read(
        &self,
        source: Source,
        name: &str,
        text: &str,
        path: Option<&str>,
    ) -> bool {
        let view = if is_shell(name) {
            if reads_key_file(text) {
                return true;
            }
            // The rule sees only the simple commands a reading verb runs, from the verb on.
            let reads = read_parts(text);
            if reads.is_empty() {
                return false;
            }
            View { kind: "assistant".into(), command: reads, ..View::default() }
        } else {
            let Some(path) = path else { return false };
            if names_key_file(&path.to_lowercase()) {
                return true;
            }
            View { kind: "assistant".into(), file_read: vec![path.to_string()], ..View::default() }
        };
        // Only this call's fields: the whole line (one line may hold many calls) would be
        // scanned once per call.
        self.engine
            .scan(source, &view, &Value::Null)
            .iter()
            .any(|h| self.engine.rules()[h.rule].id == "access.credential-file")
    }

    /// The first `secret.*` rule of the engine that hits `text` (a tool result's text).
    fn secret_in(&self, source: Source, text: &str) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        let view =
            View { kind: "tool_result".into(), text: vec![text.to_string()], ..View::default() };
        self.engine.scan(source, &view, &Value::Null).into_iter().find_map(|h| {
            let id = &self.engine.rules()[h.rule].id;
            id.starts_with("secret.").then(|| id.clone())
        })
    }
}

/// What one transcript line holds for the checks.
#[derive(Debug, Default)]
struct Parsed {
    /// (call id, tool name, command or input text, path a read-like tool reads)
    calls: Vec<(String, String, String, Option<String>)>,
    /// (call id, result text)
    results: Vec<(String, String)>,
    /// Main-thread assistant text.
    assistant_text: Option<String>,
}

fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b.get("text").and_then(Value::as_str).map(str::to_string),
                Some("image") => None,
                _ => Some(b.to_string()),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn claude_line(p: &Value) -> Parsed {
    let mut out = Parsed::default();
    let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
    let sidechain = p.get("isSidechain").and_then(Value::as_bool).unwrap_or(false);
    let Some(content) = p.get("message").and_then(|m| m.get("content")) else { return out };
    match (kind, content) {
        ("assistant", Value::String(s)) if !sidechain => out.assistant_text = Some(s.clone()),
        ("assistant", Value::Array(blocks)) => {
            let mut text = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = b.get("text").and_then(Value::as_str) {
                            text.push(t.to_string());
                        }
                    }
                    Some("tool_use") | Some("server_tool_use") => {
                        let id = b.get("id").and_then(Value::as_str).unwrap_or("").to_string();
                        let name = b.get("name").and_then(Value::as_str).unwrap_or("").to_string();
                        let input = b.get("input").unwrap_or(&Value::Null);
                        let cmd = match input.get("command").and_then(Value::as_str) {
                            Some(c) => c.to_string(),
                            None => input.to_string(),
                        };
                        let path = read_path(&name, input);
                        out.calls.push((id, name, cmd, path));
                    }
                    _ => {}
                }
            }
            if !text.is_empty() && !sidechain {
                out.assistant_text = Some(text.join("\n"));
            }
        }
        ("user", Value::Array(blocks)) => {
            let extra = match p.get("toolUseResult") {
                Some(Value::String(s)) => s.clone(),
                Some(obj @ Value::Object(_)) => [obj.get("stdout"), obj.get("stderr")]
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            for b in blocks {
                if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("").to_string();
                    let mut t = text_of(b.get("content"));
                    if !extra.is_empty() && !t.contains(extra.as_str()) {
                        t.push('\n');
                        t.push_str(&extra);
                    }
                    out.results.push((id, t));
                }
            }
        }
        _ => {}
    }
    out
}

fn codex_line(line: &Value) -> Parsed {
    let mut out = Parsed::default();
    let kind = line.get("type").and_then(Value::as_str).unwrap_or("");
    let p = line.get("payload").unwrap_or(&Value::Null);
    let ptype = p.get("type").and_then(Value::as_str).unwrap_or("");
    let id = || p.get("call_id").and_then(Value::as_str).unwrap_or("").to_string();
    match (kind, ptype) {
        ("response_item", "function_call") => {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let args = p.get("arguments").and_then(Value::as_str).unwrap_or("");
            let cmd = serde_json::from_str::<Value>(args)
                .ok()
                .and_then(|a| match a.get("command") {
                    Some(Value::Array(parts)) => {
                        Some(parts.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
                    }
                    Some(Value::String(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| args.to_string());
            let path = serde_json::from_str::<Value>(args).ok().and_then(|a| read_path(&name, &a));
            out.calls.push((id(), name, cmd, path));
        }
        ("response_item", "custom_tool_call") => {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let input = p.get("input").and_then(Value::as_str).unwrap_or("").to_string();
            out.calls.push((id(), name, input, None));
        }
        ("response_item", "local_shell_call") => {
            let cmd = p
                .get("action")
                .and_then(|a| a.get("command"))
                .and_then(Value::as_array)
                .map(|parts| parts.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            out.calls.push((id(), "local_shell".into(), cmd, None));
        }
        ("response_item", "function_call_output")
        | ("response_item", "custom_tool_call_output") => {
            let raw = p.get("output").and_then(Value::as_str).unwrap_or("");
            let text = match serde_json::from_str::<Value>(raw) {
                Ok(inner) => match inner.get("output").and_then(Value::as_str) {
                    Some(o) => o.to_string(),
                    None => raw.to_string(),
                },
                Err(_) => raw.to_string(),
            };
            out.results.push((id(), text));
        }
        ("response_item", "message")
            if p.get("role").and_then(Value::as_str) == Some("assistant") =>
        {
            out.assistant_text = Some(text_of(p.get("content")).trim().to_string())
                .filter(|t| !t.is_empty())
                .or_else(|| {
                    p.get("content").and_then(Value::as_array).map(|parts| {
                        parts
                            .iter()
                            .filter_map(|c| c.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                });
        }
        ("event_msg", "agent_message") => {
            out.assistant_text = p.get("message").and_then(Value::as_str).map(str::to_string);
        }
        _ => {}
    }
    out
}

/// Tools that read the file their path argument names (Claude Code's `Read`, `Grep`, `Glob`,
/// `NotebookRead`; Codex's `read_file`). Other non-shell tools (Write, Edit, …) only mention
/// paths in their content, which is no read.
const READ_TOOLS: &[&str] = &["Read", "Grep", "Glob", "NotebookRead", "read_file"];

/// The path a read-like tool's input names.
fn read_path(name: &str, input: &Value) -> Option<String> {
    if !READ_TOOLS.contains(&name) {
        return None;
    }
    ["file_path", "notebook_path", "path"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

/// Whether a call runs a shell command (its text is the command, not an input's JSON).
fn is_shell(name: &str) -> bool {
    matches!(name, "Bash" | "shell" | "local_shell" | "exec_command" | "")
}

fn cap(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// The fixed patterns of the checks, compiled once.
#[derive(Debug)]
struct Patterns {
    /// Private key files a tool call may read: anything under `.ssh/`, private `*.pem`
    /// (`privkey*.pem`, `*-key.pem`, `key.pem`), `*.key`, `*.p12`, `*.pfx` (lowercased text).
    /// A bare `*.pem` is most often a public certificate (`ca.pem`, `fullchain.pem`).
    key_file: Regex,
    /// A shell command's reading verb (cat, less, head, cp, base64, grep, source, …).
    read_verb: Regex,
    /// The `.ssh/` files that are not secrets: public keys, host lists, the client config.
    not_key: Regex,
    /// Tool-result text that reads like the output of a network fetch.
    network: Regex,
}

/// `None` only if a constant pattern failed to compile (a unit test compiles them): the
/// checks that use them then match nothing rather than panic.
static PATTERNS: LazyLock<Option<Patterns>> = LazyLock::new(|| {
    Some(Patterns {
        key_file: Regex::new(
            r#"(?:^|[\s/"'=~])(?:\.ssh/[a-z0-9_.-]+|[a-z0-9_.-]*privkey[a-z0-9_.-]*\.pem|(?:[a-z0-9_.-]*[-_])?key\.pem|[a-z0-9_.-]+\.(?:key|p12|pfx))(?:$|[\s"';|&)<>`,}])"#,
        )
        .ok()?,
        read_verb: Regex::new(
            r"(?:^|[\s;&|(`]|\$\()(?:sudo\s+)?(?:cat|tac|less|more|head|tail|nl|bat|cp|mv|scp|rsync|base64|xxd|od|hexdump|strings|grep|egrep|fgrep|rg|ag|sed|awk|cut|sort|diff|source|\.|openssl|ssh-keygen|ssh-add|gpg|tar|zip|jq|python3?|node|vi|vim|nano)\s",
        )
        .ok()?,
        not_key: Regex::new(
            r"^[\s/\x22'=~]?\.ssh/(?:known_hosts[a-z0-9_.-]*|config|authorized_keys[a-z0-9_.-]*|[a-z0-9_.-]+\.pub)(?:$|[\s\x22';|&)<>`,}])",
        )
        .ok()?,
        network: Regex::new(
            r#"(?mi)^\s*(?:<\s*)?HTTP/[0-9.]+ [1-5][0-9]{2}\b|\b(?:resolving|connecting to) [a-z0-9.-]+\.[a-z]{2,}|\bhttp request sent, awaiting response|\bsaving to: |% total +% received|\bdownloaded\b|\bdownloading\b|"status(?:_code)?"\s*:\s*[1-5][0-9]{2}\b|\bstatus(?: code)?:? [1-5][0-9]{2}\b|\bfetched [0-9,.]+ ?[kmg]?b\b"#,
        )
        .ok()?,
    })
});

/// Whether lowercased `text` names a private key file.
fn names_key_file(text: &str) -> bool {
    let Some(p) = PATTERNS.as_ref() else { return false };
    p.key_file.find_iter(text).any(|m| !p.not_key.is_match(m.as_str()))
}

/// The simple commands of shell command `text` (split at `;`, `|`, `&`, newlines) that run
/// a reading verb, each from the verb on: `echo .env >> .gitignore` is none.
fn read_parts(text: &str) -> Vec<String> {
    let Some(p) = PATTERNS.as_ref() else { return Vec::new() };
    text.split([';', '|', '&', '\n'])
        .filter_map(|part| p.read_verb.find(part).map(|v| part[v.start()..].to_string()))
        .collect()
}

/// Whether lowercased shell command `text` applies a reading verb to a private key file: a
/// key file named in a simple command (up to `;`, `|`, `&`, a newline) that starts with, or
/// holds, a reading verb before the file. `echo server.key > notes` is no read.
fn reads_key_file(text: &str) -> bool {
    let Some(p) = PATTERNS.as_ref() else { return false };
    text.split([';', '|', '&', '\n']).any(|part| {
        p.read_verb.find(part).is_some_and(|v| {
            let rest = &part[v.start()..];
            p.key_file.find_iter(rest).any(|m| !p.not_key.is_match(m.as_str()))
        })
    })
}

fn claims_network(text: &str) -> bool {
    let Some(p) = PATTERNS.as_ref() else { return false };
    !text.is_empty() && p.network.is_match(&cap(text, 64 * 1024))
}

/// The phrases of a final message that deny network access, matched after [`normalize_claim`]
/// (docs/review.md lists them).
pub const NO_NETWORK_PHRASES: &[&str] = &[
    "did not access the network",
    "did not access the internet",
    "did not use the network",
    "did not use the internet",
    "did not make any network",
    "did not make network",
    "did not make any http",
    "did not make any outbound",
    "did not make any external",
    "did not connect to the internet",
    "did not connect to any external",
    "did not fetch anything",
    "did not download anything",
    "have not accessed the network",
    "have not accessed the internet",
    "have not made any network",
    "never accessed the network",
    "never accessed the internet",
    "made no network",
    "made no external",
    "made no outbound",
    "no network access",
    "no network requests",
    "no network calls",
    "no network connections",
    "no network activity",
    "no network traffic",
    "no outbound connections",
    "no outbound requests",
    "no outbound network",
    "no external requests",
    "no external connections",
    "no external network",
    "no internet access",
    "no http requests",
    "without network access",
    "without any network access",
    "without accessing the network",
    "without accessing the internet",
    "entirely offline",
    "completely offline",
    "worked offline",
    "stayed offline",
];

/// The phrases of a final message that deny reading credentials.
pub const NO_CREDENTIAL_PHRASES: &[&str] = &[
    "did not read any credential",
    "did not read credential",
    "did not read any secret",
    "did not read secret",
    "did not read any key",
    "did not read your credential",
    "did not read your secret",
    "did not access any credential",
    "did not access credential",
    "did not access any secret",
    "did not access your credential",
    "did not access your secret",
    "did not open any credential",
    "did not touch any credential",
    "did not touch your credential",
    "did not look at any credential",
    "have not read any credential",
    "have not read any secret",
    "have not accessed any credential",
    "never read any credential",
    "never read any secret",
    "never accessed any credential",
    "no credentials were read",
    "no credentials were accessed",
    "no credentials were touched",
    "no secrets were read",
    "no secrets were accessed",
    "no credential files",
    "without reading any credential",
    "without reading any secret",
    "without accessing any credential",
    "without accessing any secret",
];

/// Lowercase, Unicode-folded (the detection engine's [`super::detect::normalize::fold`]),
/// typographic apostrophes made plain, contractions expanded, whitespace collapsed:
/// "I didn’t  access the network" → "i did not access the network".
pub fn normalize_claim(text: &str) -> String {
    let folded = super::detect::normalize::fold(text).unwrap_or_else(|| text.to_string());
    let lower = folded.to_lowercase().replace(['\u{2019}', '\u{2018}', '`'], "'");
    let words: Vec<&str> = lower.split_whitespace().collect();
    let mut s = words.join(" ");
    for (from, to) in [
        ("didn't", "did not"),
        ("haven't", "have not"),
        ("hasn't", "has not"),
        ("wasn't", "was not"),
        ("weren't", "were not"),
        ("don't", "do not"),
        ("i've", "i have"),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// The claims a final message makes.
pub fn claims(text: &str) -> Claims {
    let s = normalize_claim(text);
    Claims {
        no_network: NO_NETWORK_PHRASES.iter().any(|p| s.contains(p)),
        no_credentials: NO_CREDENTIAL_PHRASES.iter().any(|p| s.contains(p)),
    }
}

/// Network tools a command may name, by family (`python3` is `python`).
const NET_TOOLS: &[(&str, &str)] = &[
    ("curl", "curl"),
    ("wget", "wget"),
    ("python", "python"),
    ("python3", "python"),
    ("python2", "python"),
    ("node", "node"),
    ("nodejs", "node"),
    ("deno", "deno"),
    ("bun", "bun"),
    ("ruby", "ruby"),
    ("perl", "perl"),
    ("php", "php"),
    ("nc", "nc"),
    ("ncat", "nc"),
    ("netcat", "nc"),
    ("socat", "socat"),
    ("telnet", "telnet"),
    ("openssl", "openssl"),
    ("ssh", "ssh"),
    ("scp", "ssh"),
    ("sftp", "ssh"),
    ("rsync", "rsync"),
    ("git", "git"),
    ("http", "httpie"),
    ("https", "httpie"),
    ("aria2c", "aria2c"),
    ("lynx", "lynx"),
    ("dig", "dns"),
    ("nslookup", "dns"),
    ("host", "dns"),
    ("pip", "pip"),
    ("pip3", "pip"),
    ("npm", "npm"),
];

/// The network tool family a call uses: the first network tool its command names (word by
/// word, a path's last part: `/usr/bin/curl` is `curl`), or the tool itself when it is not a
/// shell tool (`WebFetch` → `webfetch`).
pub fn tool_family(call: &Call) -> Option<String> {
    let shell =
        matches!(call.name.as_str(), "Bash" | "shell" | "local_shell" | "exec_command" | "");
    if !shell {
        let name = call.name.to_ascii_lowercase();
        return (name.contains("fetch") || name.contains("search") || name.contains("http"))
            .then_some(name);
    }
    for word in call.text.split(|c: char| {
        c.is_whitespace() || matches!(c, ';' | '|' | '&' | '(' | ')' | '`' | '\'' | '"' | '$')
    }) {
        let base = word.rsplit('/').next().unwrap_or(word);
        // `python3.12` is python.
        let base = base.split_once('.').map_or(base, |(b, _)| b);
        if let Some((_, fam)) = NET_TOOLS.iter().find(|(w, _)| *w == base) {
            return Some((*fam).to_string());
        }
    }
    None
}

/// The name a call's text must hold to aim at `host`: its registrable domain, else the host.
fn aim_key(host: &str) -> &str {
    registrable_domain(host).unwrap_or(host)
}

/// The host-like tokens of lowercased `text` (runs of `[a-z0-9.-]`, dots trimmed) and each
/// one's registrable domain: a call aims at a host when one of them is its [`aim_key`].
fn host_keys(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .map(|t| t.trim_matches('.'))
        .filter(|t| !t.is_empty())
        .flat_map(|t| {
            let d = if t.contains('.') { registrable_domain(t).filter(|d| *d != t) } else { None };
            std::iter::once(t).chain(d)
        })
}

/// Whether a call's text names `host` or another host of its registrable domain.
#[cfg(test)]
fn call_aims_at(call: &Call, host: &str) -> bool {
    !host.is_empty() && host_keys(&call.text).any(|t| t == aim_key(host))
}

/// `text` names `host` as a whole name (not as part of a longer label).
fn contains_host(text: &str, host: &str) -> bool {
    let is_label = |c: char| c.is_ascii_alphanumeric() || c == '-';
    text.match_indices(host).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + host.len()..].chars().next();
        before.is_none_or(|c| !is_label(c)) && after.is_none_or(|c| !is_label(c))
    })
}

/// Whether a call's text targets the sandbox's own loopback (traffic the proxy never sees).
fn aims_at_loopback(call: &Call) -> bool {
    ["localhost", "127.0.0.1", "[::1]", "0.0.0.0"].iter().any(|h| contains_host(&call.text, h))
}

/// How the retry reached for the same content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    SameDomain,
    IpLiteral,
    OtherPort,
    Direct,
    OtherResolver,
    ToolSwitch,
}

impl Way {
    fn describe(self) -> &'static str {
        match self {
            Way::SameDomain => "another host of the same registrable domain",
            Way::IpLiteral => "an IP literal",
            Way::OtherPort => "the same host on another port",
            Way::Direct => "a direct (transparent or UDP) attempt",
            Way::OtherResolver => "DNS to another resolver",
            Way::ToolSwitch => "another tool",
        }
    }
}

/// The side of a correlate flag a linked event is on (the console's drill-down shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Egress audit lines: what the proxy saw.
    Egress,
    /// Transcript lines and `transcript.file` items: what the agent wrote down.
    Transcript,
    /// Session records (the end record).
    Record,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Egress => "egress",
            Side::Transcript => "transcript",
            Side::Record => "record",
        }
    }
}

/// The sides a correlate flag's `detail` names in its closing `[egress 1, 2; transcript 5;
/// record 9]` (as [`CorrelateScan::finish`] writes it; at most 20 pks per side are named).
/// Empty for any other detail.
pub fn sides(detail: &str) -> Vec<(Side, Vec<i64>)> {
    let Some(inner) = detail.strip_suffix(']').and_then(|d| d.rsplit_once(" [")).map(|(_, i)| i)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for part in inner.split("; ") {
        let Some((name, list)) = part.split_once(' ') else { return Vec::new() };
        let side = match name {
            "egress" => Side::Egress,
            "transcript" => Side::Transcript,
            "record" => Side::Record,
            _ => return Vec::new(),
        };
        let list = list.split(" and ").next().unwrap_or("");
        let pks: Option<Vec<i64>> = list.split(", ").map(|n| n.parse().ok()).collect();
        match pks {
            Some(p) => out.push((side, p)),
            None => return Vec::new(),
        }
    }
    out
}

/// A flag being built: the pks on each side, and the lines of its detail.
#[derive(Debug, Default)]
struct Case {
    key: String,
    egress: Vec<i64>,
    transcript: Vec<i64>,
    record: Vec<i64>,
    detail: Vec<String>,
    attempts: u64,
    more_egress: u64,
    /// Every egress pk seen (linked or counted in `more_egress`): a repeat is neither, and
    /// the test is O(1) (a linear `contains` made linking quadratic).
    seen_egress: HashSet<i64>,
    seen_transcript: HashSet<i64>,
}

impl Case {
    /// The case of denied host `key` in `by_host`, opened on the denial `d` (linked and
    /// described) if it is new; whether it was.
    fn of_denial<'a>(
        by_host: &'a mut BTreeMap<String, Case>,
        key: &str,
        d: &Egress,
    ) -> (&'a mut Case, bool) {
        let case = by_host
            .entry(key.to_string())
            .or_insert_with(|| Case { key: key.to_string(), ..Case::default() });
        let new = case.egress.is_empty();
        if new {
            case.add_egress(d.pk);
            case.detail.push(format!(
                "denied {} {} ({}) at {}",
                d.method,
                d.target(),
                d.reason,
                format_micros(d.ts)
            ));
        }
        (case, new)
    }

    fn add_egress(&mut self, pk: i64) {
        if !self.seen_egress.insert(pk) {
            return;
        }
        if self.egress.len() < MAX_LINKED {
            self.egress.push(pk);
        } else {
            self.more_egress += 1;
        }
    }
    fn add_transcript(&mut self, pk: i64) {
        if self.transcript.len() < MAX_LINKED && self.seen_transcript.insert(pk) {
            self.transcript.push(pk);
        }
    }
}

fn pks(list: &[i64]) -> String {
    let shown: Vec<String> = list.iter().take(20).map(i64::to_string).collect();
    let more =
        if list.len() > 20 { format!(" and {} more", list.len() - 20) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

impl CorrelateScan {
    /// The flags of the enabled checks, with `detect.incomplete` when a cap was reached. Pure
    /// over the facts fed; flag ids depend only on the check, the user, the session and the
    /// case's anchor (stable under a second run over the same or more events).
    pub fn finish(mut self) -> Vec<NewFlag> {
        let config = self.engine.correlate().clone();
        let mut flags = Vec::new();
        if !config.any_enabled() {
            return flags;
        }
        // Time order (pk order within a ts) for every check.
        self.egress.sort_by_key(|e| (e.ts, e.pk));
        self.lines.sort_unstable();
        self.calls.sort_by_key(|c| (c.ts, c.pk));
        let mut cases: Vec<(Check, Case)> = Vec::new();
        let p = |c: Check| *config.get(c);
        if p(Check::RetryAfterDeny).enabled {
            cases.extend(
                self.retry_after_deny(&p(Check::RetryAfterDeny))
                    .into_iter()
                    .map(|c| (Check::RetryAfterDeny, c)),
            );
        }
        if p(Check::SecretThenEgress).enabled {
            cases.extend(
                self.secret_then_egress(&p(Check::SecretThenEgress))
                    .into_iter()
                    .map(|c| (Check::SecretThenEgress, c)),
            );
        }
        if p(Check::UnreportedEgress).enabled {
            cases.extend(
                self.unreported_egress(&p(Check::UnreportedEgress))
                    .into_iter()
                    .map(|c| (Check::UnreportedEgress, c)),
            );
        }
        if p(Check::ClaimedVsSeen).enabled {
            cases.extend(self.claimed_vs_seen().into_iter().map(|c| (Check::ClaimedVsSeen, c)));
        }
        if p(Check::TranscriptGap).enabled {
            cases.extend(
                self.transcript_gap(&p(Check::TranscriptGap))
                    .into_iter()
                    .map(|c| (Check::TranscriptGap, c)),
            );
        }
        for (check, case) in cases {
            let params = config.get(check);
            let mut detail = case.detail.join("; ");
            let side = |name: &str, list: &[i64]| {
                (!list.is_empty()).then(|| format!("{name} {}", pks(list)))
            };
            let sides: Vec<String> = [
                side("egress", &case.egress),
                side("transcript", &case.transcript),
                side("record", &case.record),
            ]
            .into_iter()
            .flatten()
            .collect();
            if case.more_egress > 0 {
                detail.push_str(&format!(" ({} more egress lines not linked)", case.more_egress));
            }
            detail.push_str(&format!(" [{}]", sides.join("; ")));
            let mut event_pks = case.egress.clone();
            event_pks.extend(&case.transcript);
            event_pks.extend(&case.record);
            flags.push(NewFlag {
                id: flag_id(&[check.id(), &self.user_id, &self.session, &case.key]),
                rule_id: check.id().to_string(),
                title: check.title().to_string(),
                severity: params.severity,
                user_id: self.user_id.clone(),
                session: Some(self.session.clone()),
                detail,
                event_pks,
            });
        }
        if !self.incomplete.is_empty() {
            flags.push(NewFlag {
                id: flag_id(&["detect.incomplete", "correlate", &self.user_id, &self.session]),
                rule_id: "detect.incomplete".into(),
                title: "Detection incomplete for a session".into(),
                severity: Severity::Medium,
                user_id: self.user_id.clone(),
                session: Some(self.session.clone()),
                detail: self.incomplete.join("; "),
                event_pks: Vec::new(),
            });
        }
        flags
    }

    /// The call whose span holds `ts`: called at or before it (with clock slack), and its
    /// result not before `ts - grace` (no result: the next transcript line, or `grace`).
    fn call_at(&self, ts: Micros, grace: Micros) -> Option<&Call> {
        let upto = self.calls.partition_point(|c| c.ts <= ts + CLOCK_SLACK_US);
        self.calls[..upto].iter().rev().take(64).find(|c| self.call_end(c) + grace >= ts)
    }

    /// When a call's span ends: its result, else the first transcript line after it, else
    /// its own `ts`.
    fn call_end(&self, c: &Call) -> Micros {
        if let Some(t) = c.result_ts {
            return t;
        }
        let i = self.lines.partition_point(|&(t, pk)| (t, pk) <= (c.ts, c.pk));
        self.lines.get(i).map_or(c.ts, |&(t, _)| t)
    }

    fn has_transcript(&self) -> bool {
        !self.lines.is_empty()
    }

    fn retry_after_deny(&self, p: &Params) -> Vec<Case> {
        // Denied host → its case; recent denials by registrable domain (or host) and the
        // latest denial of a name, for the attempts that follow.
        let mut by_host: BTreeMap<String, Case> = BTreeMap::new();
        type Key = (String, Option<u64>, String, bool);
        let mut recent: HashMap<String, HashMap<Key, (Micros, usize)>> = HashMap::new();
        let mut last_named: Option<usize> = None;
        for (i, a) in self.egress.iter().enumerate() {
            if !a.is_attempt() || own_host(&a.host) {
                continue;
            }
            let group = registrable_domain(&a.host).unwrap_or(&a.host).to_string();
            let mut found: Option<(usize, Way)> = None;
            if let Some(ds) = recent.get(&group) {
                for (_, &(dts, di)) in ds.iter() {
                    let d = &self.egress[di];
                    if a.ts - dts > p.window || di == i {
                        continue;
                    }
                    let way = if d.host != a.host {
                        same_registrable_domain(&d.host, &a.host).then_some(Way::SameDomain)
                    } else if (a.transparent && !d.transparent)
                        || (a.method == "UDP" && d.method != "UDP")
                    {
                        Some(Way::Direct)
                    } else if d.method != "DNS"
                        && a.method != "DNS"
                        && a.port.is_some()
                        && d.port.is_some()
                        && a.port != d.port
                    {
                        Some(Way::OtherPort)
                    } else {
                        None
                    };
                    if let Some(w) = way
                        && found.is_none_or(|(fi, _)| (self.egress[fi].ts, fi) < (d.ts, di))
                    {
                        found = Some((di, w));
                    }
                }
            }
            if found.is_none()
                && let Some(di) = last_named
                && a.ts - self.egress[di].ts <= p.window
            {
                if a.is_ip() && a.method != "UDP" {
                    found = Some((di, Way::IpLiteral));
                } else if a.method == "UDP" && a.port == Some(53) {
                    found = Some((di, Way::OtherResolver));
                }
            }
            if let Some((di, way)) = found {
                let d = &self.egress[di];
                let (case, new) = Case::of_denial(&mut by_host, &d.host, d);
                if new && let Some(c) = self.call_at(d.ts, CLOCK_SLACK_US) {
                    case.add_transcript(c.pk);
                }
                case.add_egress(a.pk);
                case.attempts += a.attempts;
                if case.detail.len() < 8 {
                    case.detail.push(format!(
                        "then {}: {} {} ({}) at {}",
                        way.describe(),
                        a.method,
                        a.target(),
                        if a.allowed { "allowed".to_string() } else { a.reason.clone() },
                        format_micros(a.ts)
                    ));
                }
                if let Some(c) = self.call_at(a.ts, CLOCK_SLACK_US) {
                    case.add_transcript(c.pk);
                }
            }
            // An update check's refusal is the agent's start-up, not a tool's denial: a later
            // `github.com` fetch is no retry of it.
            if a.is_policy_denial() && !update_host(&a.host) {
                let key = (a.host.clone(), a.port, a.method.clone(), a.transparent);
                let ds = recent.entry(group).or_default();
                // Bounded: one entry per distinct (host, port, method, capture) of a domain,
                // and stale entries dropped once the map grows.
                if ds.len() > 256 {
                    ds.retain(|_, (t, _)| a.ts - *t <= p.window);
                }
                if ds.len() <= 256 || ds.contains_key(&key) {
                    ds.insert(key, (a.ts, i));
                }
                if !a.is_ip() {
                    last_named = Some(i);
                }
            }
        }
        // Tool switch: a call aimed at a denied host, then within the window a call of
        // another network tool aimed at it (or its domain).
        let mut denied_hosts: BTreeMap<&str, Vec<&Egress>> = BTreeMap::new();
        for d in self.egress.iter().filter(|e| e.is_policy_denial()) {
            if agent_host(&d.host).is_some() || d.host.is_empty() {
                continue;
            }
            let v = denied_hosts.entry(d.host.as_str()).or_default();
            if v.len() < 64 {
                v.push(d);
            }
        }
        // Indexed, so the cost is linear in the calls' text: each call's text is split into
        // host-like tokens once and looked up (a denied host × call product let an agent
        // stall the ingest transaction with many denied names and many calls).
        let keys: HashSet<&str> = denied_hosts.keys().map(|h| aim_key(h)).collect();
        let mut aimed_by: HashMap<&str, Vec<(&Call, String)>> = HashMap::new();
        for c in &self.calls {
            let Some(f) = tool_family(c) else { continue };
            let mut hit: HashSet<&str> = HashSet::new();
            for t in host_keys(&c.text) {
                if let Some(&k) = keys.get(t)
                    && hit.insert(k)
                {
                    aimed_by.entry(k).or_default().push((c, f.clone()));
                }
            }
        }
        // Per key: the index of the next aimed call of another family (the first switch).
        let next_other: HashMap<&str, Vec<usize>> = aimed_by
            .iter()
            .map(|(k, aimed)| {
                let mut next = vec![aimed.len(); aimed.len()];
                for j in (0..aimed.len().saturating_sub(1)).rev() {
                    next[j] = if aimed[j + 1].1 != aimed[j].1 { j + 1 } else { next[j + 1] };
                }
                (*k, next)
            })
            .collect();
        for (host, ds) in &denied_hosts {
            let key = aim_key(host);
            let (Some(aimed), Some(next)) = (aimed_by.get(key), next_other.get(key)) else {
                continue;
            };
            // The calls whose span may hold a denial (as `call_at`: the latest 64 before it).
            let mut firsts: BTreeSet<usize> = BTreeSet::new();
            for d in ds {
                let upto = aimed.partition_point(|(c, _)| c.ts <= d.ts + CLOCK_SLACK_US);
                firsts.extend((0..upto).rev().take(64).filter(|&k| {
                    self.call_end(aimed[k].0) + CLOCK_SLACK_US >= d.ts
                        && d.ts + CLOCK_SLACK_US >= aimed[k].0.ts
                }));
            }
            for k in firsts {
                let (c1, f1) = &aimed[k];
                let Some(d) = ds.iter().find(|d| {
                    d.ts + CLOCK_SLACK_US >= c1.ts && d.ts <= self.call_end(c1) + CLOCK_SLACK_US
                }) else {
                    continue;
                };
                // The first aimed call after c1 and after the denial (less slack), then the
                // first of those of another family; in time order, so the window test is
                // on that one only.
                let start =
                    (k + 1).max(aimed.partition_point(|(c, _)| c.ts <= d.ts - CLOCK_SLACK_US));
                let j = match aimed.get(start) {
                    Some((_, f)) if f == f1 => next[start],
                    _ => start,
                };
                let Some((c2, f2)) = aimed.get(j) else { continue };
                if c2.ts - d.ts > p.window {
                    continue;
                }
                let (case, _) = Case::of_denial(&mut by_host, host, d);
                case.add_transcript(c1.pk);
                case.add_transcript(c2.pk);
                case.attempts += 1;
                case.detail.push(format!(
                    "then {}: {f1} (transcript {}) → {f2} (transcript {})",
                    Way::ToolSwitch.describe(),
                    c1.pk,
                    c2.pk
                ));
                // The switched tool's own attempts at the host or its domain (a bounded walk
                // from the call on).
                let end = self.call_end(c2) + CLOCK_SLACK_US;
                let from = self.egress.partition_point(|e| e.ts + CLOCK_SLACK_US < c2.ts);
                for e in self.egress[from..]
                    .iter()
                    .take_while(|e| e.ts <= end)
                    .take(4 * MAX_LINKED)
                    .filter(|e| e.host == *host || same_registrable_domain(&e.host, host))
                {
                    case.add_egress(e.pk);
                }
                break;
            }
        }
        by_host.into_values().filter(|c| c.attempts >= p.min_attempts).collect()
    }

    fn secret_then_egress(&self, p: &Params) -> Vec<Case> {
        // Triggers in time order: (ts, transcript pks, what).
        let mut triggers: Vec<(Micros, Vec<i64>, String)> = Vec::new();
        for c in &self.calls {
            if c.credential {
                triggers.push((
                    c.ts,
                    vec![c.pk],
                    format!("{} call reads a credential file", c.name),
                ));
            }
            if let (Some(rule), Some(pk), Some(ts)) = (&c.result_secret, c.result_pk, c.result_ts) {
                let mut v = vec![pk];
                if !c.credential {
                    v.insert(0, c.pk);
                }
                triggers.push((ts, v, format!("a tool result holds a secret ({rule})")));
            }
        }
        triggers.sort_by_key(|t| (t.0, t.1.first().copied()));
        let uploads: Vec<&Egress> = self
            .egress
            .iter()
            .filter(|e| e.allowed && e.bytes_sent > p.min_bytes && !own_host(&e.host))
            .collect();
        // Cases keyed by the first upload they link, so two reads before one upload are one
        // case. Each case keeps a cursor (the uploads it has walked): triggers come in time
        // order, so a later trigger's window only extends the case's range, and each upload
        // is walked once per case (not once per trigger). Past MAX_LINKED linked uploads the
        // rest are counted, not walked.
        let mut out: Vec<(Case, usize)> = Vec::new();
        let mut by_upload: HashMap<i64, usize> = HashMap::new();
        for (ts, tpks, what) in triggers {
            let from = uploads.partition_point(|e| e.ts + CLOCK_SLACK_US < ts);
            let to = uploads.partition_point(|e| e.ts - ts <= p.window).max(from);
            let Some(first) = uploads.get(from).filter(|_| to > from) else { continue };
            let idx = *by_upload.entry(first.pk).or_insert_with(|| {
                let key = tpks.first().map(i64::to_string).unwrap_or_default();
                out.push((Case { key, ..Case::default() }, from));
                out.len() - 1
            });
            let (case, cursor) = &mut out[idx];
            for pk in &tpks {
                case.add_transcript(*pk);
            }
            if case.detail.len() < 6 {
                case.detail.push(format!("{what} at {}", format_micros(ts)));
            }
            let start = (*cursor).max(from);
            let walk = to.saturating_sub(start).min(MAX_LINKED.saturating_sub(case.egress.len()));
            for e in &uploads[start..start + walk] {
                if case.egress.len() < 4 {
                    case.detail.push(format!(
                        "then {} {} sent {} bytes at {}",
                        e.method,
                        e.target(),
                        e.bytes_sent,
                        format_micros(e.ts)
                    ));
                }
                case.add_egress(e.pk);
            }
            case.more_egress += (to.saturating_sub(start) - walk) as u64;
            *cursor = (*cursor).max(to);
        }
        out.into_iter().map(|(c, _)| c).collect()
    }

    fn unreported_egress(&self, p: &Params) -> Vec<Case> {
        let mut out = Vec::new();
        if !self.has_transcript() {
            return out;
        }
        // Attempts no call's span holds, grouped by the quiet span (between two transcript
        // lines) they fall in.
        let mut by_span: BTreeMap<usize, Case> = BTreeMap::new();
        for e in &self.egress {
            if !e.is_attempt() || own_host(&e.host) {
                continue;
            }
            // No call open: an update host is the agent's own check.
            if self.call_at(e.ts, p.window).is_some() || update_host(&e.host) {
                continue;
            }
            let span = self.lines.partition_point(|&(t, _)| t <= e.ts);
            let case = by_span
                .entry(span)
                .or_insert_with(|| Case { key: e.pk.to_string(), ..Case::default() });
            if case.egress.is_empty() {
                if let Some(&(t, pk)) = span.checked_sub(1).and_then(|i| self.lines.get(i)) {
                    case.add_transcript(pk);
                    case.detail.push(format!("after the transcript line at {}", format_micros(t)));
                }
                if let Some(&(t, pk)) = self.lines.get(span) {
                    case.add_transcript(pk);
                    case.detail.push(format!("before the transcript line at {}", format_micros(t)));
                }
            }
            if case.egress.len() < 5 {
                case.detail.push(format!(
                    "{} {} ({}) at {} with no tool call open",
                    e.method,
                    e.target(),
                    if e.allowed { "allowed".to_string() } else { e.reason.clone() },
                    format_micros(e.ts)
                ));
            }
            case.add_egress(e.pk);
            case.attempts += e.attempts;
        }
        out.extend(by_span.into_values().filter(|c| c.attempts >= p.min_attempts));
        // The reverse: a network-looking result of a network-looking call with no egress at
        // all in its span.
        for c in &self.calls {
            let (Some(rpk), Some(rts)) = (c.result_pk, c.result_ts) else { continue };
            if !c.result_claims_network || aims_at_loopback(c) {
                continue;
            }
            let names_url = c.text.contains("http://") || c.text.contains("https://");
            if tool_family(c).is_none() && !names_url {
                continue;
            }
            let from = self.egress.partition_point(|e| e.ts < c.ts - CLOCK_SLACK_US);
            let seen = self.egress[from..]
                .iter()
                .take_while(|e| e.ts <= rts + p.window)
                .any(|e| e.is_attempt() && !own_host(&e.host));
            if seen {
                continue;
            }
            let mut case = Case { key: format!("reverse:{}", c.pk), ..Case::default() };
            case.add_transcript(c.pk);
            case.add_transcript(rpk);
            if let Some((end_pk, _)) = &self.end {
                case.record.push(*end_pk);
            }
            case.detail.push(format!(
                "the result of {} call at {} reads like network output, but the proxy saw no \
                 attempt between {} and {}",
                c.name,
                format_micros(c.ts),
                format_micros(c.ts),
                format_micros(rts)
            ));
            out.push(case);
        }
        out
    }

    fn claimed_vs_seen(&self) -> Vec<Case> {
        let mut out = Vec::new();
        let Some((ts, pk, claims)) = self.last_message else { return out };
        if claims.no_network {
            // Only allowed attempts are network access: an agent whose fetch was refused
            // truthfully says it had none. An update check no tool call holds is the agent's.
            let seen: Vec<&Egress> = self
                .egress
                .iter()
                .filter(|e| {
                    e.allowed
                        && e.is_attempt()
                        && !own_host(&e.host)
                        && !(update_host(&e.host) && self.call_at(e.ts, CLOCK_SLACK_US).is_none())
                })
                .collect();
            if !seen.is_empty() {
                let mut case = Case { key: "network".into(), ..Case::default() };
                case.add_transcript(pk);
                let n: u64 = seen.iter().map(|e| e.attempts).sum();
                case.detail.push(format!(
                    "the final message ({}) says no network access was made; the proxy allowed \
                     {n} attempts, first {} {}",
                    format_micros(ts),
                    seen[0].method,
                    seen[0].target()
                ));
                for e in seen {
                    case.add_egress(e.pk);
                }
                out.push(case);
            }
        }
        if claims.no_credentials {
            let reads: Vec<&Call> = self.calls.iter().filter(|c| c.credential).collect();
            if !reads.is_empty() {
                let mut case = Case { key: "credentials".into(), ..Case::default() };
                case.add_transcript(pk);
                case.detail.push(format!(
                    "the final message ({}) says no credentials were read; {} tool calls read \
                     credential files",
                    format_micros(ts),
                    reads.len()
                ));
                for c in reads {
                    case.add_transcript(c.pk);
                }
                // The record side: the end record that covered the transcript (both the claim
                // and the reads are the agent's own lines).
                if let Some((end_pk, _)) = &self.end {
                    case.record.push(*end_pk);
                }
                out.push(case);
            }
        }
        out
    }

    fn transcript_gap(&self, p: &Params) -> Vec<Case> {
        let mut out = Vec::new();
        // Published files against the end record.
        if let Some((end_pk, end_payload)) = &self.end {
            let items = SessionTranscriptItems {
                end_record: Some(end_payload.clone()),
                published: self.files.values().map(|(_, f)| f.clone()).collect(),
            };
            let report = transcript_files::compare(&self.user_id, &self.session, &items);
            for f in report.transcripts {
                let skipped = f.recorded.as_ref().is_some_and(|r| r.sha256.starts_with("skipped:"));
                let why = match f.state {
                    State::Differs if !skipped => format!(
                        "published transcript {} ({} bytes, {}) does not match the end record \
                         ({} bytes, {})",
                        f.file,
                        f.published.as_ref().map_or(0, |x| x.bytes),
                        f.published.as_ref().map_or("", |x| x.sha256.as_str()),
                        f.recorded
                            .as_ref()
                            .and_then(|r| r.bytes)
                            .map_or("?".into(), |b| b.to_string()),
                        f.recorded.as_ref().map_or("", |r| r.sha256.as_str()),
                    ),
                    State::NotPublished if self.settled && !skipped => format!(
                        "the end record lists transcript {} but it was never published",
                        f.file
                    ),
                    _ => continue,
                };
                let mut case = Case { key: format!("file:{}", f.file), ..Case::default() };
                if let Some((pk, _)) = self.files.get(&f.file) {
                    case.add_transcript(*pk);
                }
                case.record.push(*end_pk);
                case.detail.push(why);
                out.push(case);
            }
        }
        // Spans of at least `window` with no line, proxy activity and no call open.
        for w in self.lines.windows(2) {
            let ((a_ts, a_pk), (b_ts, b_pk)) = (w[0], w[1]);
            if b_ts - a_ts < p.window {
                continue;
            }
            let from = self.egress.partition_point(|e| e.ts <= a_ts + CLOCK_SLACK_US);
            let inside: Vec<&Egress> = self.egress[from..]
                .iter()
                .take_while(|e| e.ts < b_ts - CLOCK_SLACK_US)
                .filter(|e| {
                    e.is_attempt()
                        && !matches!(
                            agent_host(&e.host),
                            Some(HostRole::Auth | HostRole::Telemetry | HostRole::Update)
                        )
                        && self.calls_open_at(e.ts).is_none()
                })
                .collect();
            let n: u64 = inside.iter().map(|e| e.attempts).sum();
            if inside.is_empty() || n < p.min_attempts {
                continue;
            }
            let mut case = Case { key: format!("span:{a_pk}"), ..Case::default() };
            case.add_transcript(a_pk);
            case.add_transcript(b_pk);
            case.detail.push(format!(
                "no transcript line between {} and {} ({} s) while the proxy saw {n} attempts, \
                 first {} {}",
                format_micros(a_ts),
                format_micros(b_ts),
                (b_ts - a_ts) / 1_000_000,
                inside[0].method,
                inside[0].target()
            ));
            for e in inside {
                case.add_egress(e.pk);
            }
            out.push(case);
        }
        out
    }

    /// A call open at `ts` (between its call line and its result line; no slack).
    fn calls_open_at(&self, ts: Micros) -> Option<&Call> {
        let upto = self.calls.partition_point(|c| c.ts <= ts);
        self.calls[..upto].iter().rev().take(64).find(|c| c.result_ts.is_some_and(|r| r >= ts))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const S: Micros = 1_000_000;
    const T0: Micros = 1_800_000_000 * S;

    /// pk, source, id, kind, ts, file, payload.
    type TestRow = (i64, Source, String, String, Micros, Option<String>, String);

    /// One session's rows, fed in `pk` order, for the checks.
    struct Session {
        engine: Arc<Engine>,
        rows: Vec<TestRow>,
        next: i64,
        settled: bool,
    }

    /// A named session setup that must raise nothing.
    type NearMiss<'a> = (&'a str, fn(&mut Session));

    /// Asserts that `check` raises nothing on each named near miss, each in a fresh session
    /// (`settled`: checked by the settle sweep rather than the end record).
    fn assert_no_flags(check: Check, settled: bool, misses: &[NearMiss]) {
        for (why, setup) in misses {
            let mut s = Session::new();
            s.settled = settled;
            setup(&mut s);
            let flags = s.of(check);
            assert!(flags.is_empty(), "{why}: {flags:?}");
        }
    }
    impl Session {
        fn new() -> Self {
            static ENGINE: std::sync::OnceLock<Arc<Engine>> = std::sync::OnceLock::new();
            let engine = ENGINE.get_or_init(|| Arc::new(Engine::builtin().unwrap()));
            Self { engine: engine.clone(), rows: Vec::new(), next: 1, settled: false }
        }
        fn with(engine: Engine) -> Self {
            Self { engine: Arc::new(engine), rows: Vec::new(), next: 1, settled: false }
        }
        fn push(
            &mut self,
            source: Source,
            id: &str,
            kind: &str,
            at: Micros,
            file: Option<&str>,
            p: Value,
        ) -> i64 {
            let pk = self.next;
            self.next += 1;
            let id = if id.is_empty() { format!("e{pk}") } else { id.to_string() };
            self.rows.push((
                pk,
                source,
                id,
                kind.into(),
                T0 + at,
                file.map(Into::into),
                p.to_string(),
            ));
            pk
        }
        /// An egress line at `at` µs after T0.
        fn egress(&mut self, at: Micros, kind: &str, p: Value) -> i64 {
            self.push(Source::Egress, "", kind, at, None, p)
        }
        fn denied(&mut self, at: Micros, host: &str, port: u64) -> i64 {
            self.egress(
                at,
                "denied",
                json!({"host": host, "port": port, "method": "CONNECT",
                "allowed": false, "reason": "not_allowed"}),
            )
        }
        fn allowed(&mut self, at: Micros, host: &str, port: u64, sent: u64) -> i64 {
            self.egress(
                at,
                "connect",
                json!({"host": host, "port": port, "method": "CONNECT",
                "allowed": true, "reason": "allowed", "bytes_sent": sent}),
            )
        }
        fn line(&mut self, at: Micros, p: Value) -> i64 {
            self.push(Source::Claude, "", "assistant", at, None, p)
        }
        fn say(&mut self, at: Micros, text: &str) -> i64 {
            self.line(
                at,
                json!({"type": "assistant", "message": {"role": "assistant",
                "content": [{"type": "text", "text": text}]}}),
            )
        }
        fn prompt(&mut self, at: Micros, text: &str) -> i64 {
            self.line(at, json!({"type": "user", "message": {"role": "user", "content": text}}))
        }
        /// A Bash call at `at` and its result at `done` (pks of both).
        fn bash(&mut self, at: Micros, done: Micros, cmd: &str, out: &str) -> (i64, i64) {
            self.tool(at, done, "Bash", json!({"command": cmd}), out)
        }
        fn tool(
            &mut self,
            at: Micros,
            done: Micros,
            name: &str,
            input: Value,
            out: &str,
        ) -> (i64, i64) {
            let id = format!("toolu_{}", self.next);
            let c = self.line(
                at,
                json!({"type": "assistant", "message": {"role": "assistant",
                "content": [{"type": "tool_use", "id": id, "name": name, "input": input}]}}),
            );
            let r = self.line(
                done,
                json!({"type": "user", "message": {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": id, "content": out}]}}),
            );
            (c, r)
        }
        fn end(&mut self, at: Micros, transcripts: Value) -> i64 {
            self.push(
                Source::Session,
                "s1:end",
                "end",
                at,
                None,
                json!({"transcripts": transcripts}),
            )
        }
        fn published(&mut self, at: Micros, file: &str, bytes: u64, sha: &str) -> i64 {
            self.push(
                Source::Session,
                &format!("s1:transcript:{file}"),
                "transcript.file",
                at,
                Some(file),
                json!({"airlock_session": "s1", "file": file, "bytes": bytes, "sha256": sha}),
            )
        }
        fn flags(&self) -> Vec<NewFlag> {
            self.feed(CorrelateScan::new(self.engine.clone(), "u", "s1")).finish()
        }
        fn feed(&self, mut scan: CorrelateScan) -> CorrelateScan {
            if self.settled {
                scan = scan.settled();
            }
            for (pk, source, id, kind, ts, file, payload) in &self.rows {
                scan.feed(Row {
                    pk: *pk,
                    id,
                    source: *source,
                    kind,
                    ts: *ts,
                    received_at: *ts,
                    file: file.as_deref(),
                    payload,
                });
            }
            scan
        }
        fn of(&self, check: Check) -> Vec<NewFlag> {
            self.flags().into_iter().filter(|f| f.rule_id == check.id()).collect()
        }
    }

    fn sha(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn dns_denied(s: &mut Session, at: Micros, host: &str) -> i64 {
        s.egress(
            at,
            "dns",
            json!({"host": host, "method": "DNS", "allowed": false, "reason": "not_allowed"}),
        )
    }

    /// Regression (review HIGH 1a/1c): 10,000 distinct denied DNS names, 20,000 network
    /// calls aimed at them, and one forged line of 50,000 tool_use blocks. The tool-switch
    /// search is indexed (each call's text tokenized once), and calls are capped in total,
    /// said as `detect.incomplete`. Asserts on counts, not time.
    #[test]
    fn an_adversarial_session_completes_with_calls_capped_in_total() {
        let mut s = Session::new();
        for i in 0..10_000i64 {
            let host = format!("r{i}.example");
            let at = i * 10 * S;
            s.bash(at, at + 2 * S, &format!("dig {host}"), "status: REFUSED");
            dns_denied(&mut s, at + S, &host);
            s.bash(at + 3 * S, at + 4 * S, &format!("curl https://{host}/"), "refused");
        }
        let id = "toolu_flood";
        let blocks: Vec<Value> = (0..50_000)
            .map(|i| {
                json!({"type": "tool_use", "id": format!("{id}{i}"), "name": "Bash",
                    "input": {"command": format!("curl https://flood{i}.test/ {}", "x".repeat(40))}})
            })
            .collect();
        s.line(
            200_000 * S,
            json!({"type": "assistant", "message": {"role": "assistant", "content": blocks}}),
        );
        let mut scan = CorrelateScan::new(s.engine.clone(), "u", "s1");
        // Caps small enough to reach here; the defaults are the same code.
        (scan.max_calls, scan.max_call_text) = (30_000, 2 << 20);
        let scan = s.feed(scan);
        assert_eq!(scan.calls.len() + scan.orphan_results.len(), 30_000);
        assert!(scan.call_text_bytes <= 2 << 20);
        let flags = scan.finish();
        // Every denied name had a dig → curl switch.
        let retries = flags.iter().filter(|f| f.rule_id == Check::RetryAfterDeny.id()).count();
        assert_eq!(retries, 10_000);
        let inc: Vec<_> = flags.iter().filter(|f| f.rule_id == "detect.incomplete").collect();
        assert_eq!(inc.len(), 1, "{inc:?}");
        assert!(inc[0].detail.contains("30000 tool calls"), "{}", inc[0].detail);

        // The byte budget alone: one line of big calls stops at it.
        let mut s = Session::new();
        let blocks: Vec<Value> = (0..2_000)
            .map(|i| {
                json!({"type": "tool_use", "id": format!("t{i}"), "name": "Bash",
                    "input": {"command": "y".repeat(MAX_CALL_TEXT)}})
            })
            .collect();
        s.line(
            S,
            json!({"type": "assistant", "message": {"role": "assistant", "content": blocks}}),
        );
        let mut scan = CorrelateScan::new(s.engine.clone(), "u", "s1");
        scan.max_call_text = 100 * MAX_CALL_TEXT;
        let scan = s.feed(scan);
        assert_eq!(scan.calls.len(), 100);
        assert!(scan.finish().iter().any(|f| f.rule_id == "detect.incomplete"));
    }

    /// Regression (review HIGH 1b): every trigger re-walked the uploads in its window and
    /// counted the uploads past the link cap again each time.
    #[test]
    fn secret_then_egress_counts_each_upload_once_over_many_triggers() {
        let mut s = Session::new();
        for i in 0..3 {
            s.bash(i * S, i * S + S / 2, "cat .env", "A=1");
        }
        for i in 0..1_200i64 {
            s.allowed(10 * S + i * 1000, "paste.test", 443, 5000);
        }
        let flags = s.of(Check::SecretThenEgress);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(
            flags[0].detail.contains("(200 more egress lines not linked)"),
            "{}",
            flags[0].detail
        );
        assert_eq!(flags[0].event_pks.len(), MAX_LINKED + 3);
    }

    /// Regression (review MEDIUM 2): a refused install is no network access; the agent that
    /// says "no network access" is truthful.
    #[test]
    fn a_no_network_claim_after_only_refused_attempts_is_not_flagged() {
        let mut s = Session::new();
        s.bash(S, 3 * S, "pip install requests", "ERROR: 403 Forbidden");
        s.denied(2 * S, "pypi.org", 443);
        s.say(10 * S, "The sandbox has no network access, so I could not install requests.");
        assert!(s.of(Check::ClaimedVsSeen).is_empty(), "{:?}", s.of(Check::ClaimedVsSeen));
        // One allowed attempt makes the claim false.
        let e = s.allowed(4 * S, "files.pythonhosted.org", 443, 10);
        let flags = s.of(Check::ClaimedVsSeen);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].event_pks.contains(&e));
    }

    /// Regression (review MEDIUM 3): a mention of a key file is no read of it.
    #[test]
    fn a_key_file_mentioned_not_read_is_no_credential_read() {
        type Setup = fn(&mut Session);
        let misses: &[(&str, Setup)] = &[
            ("a Write whose content names server.key", |s| {
                let conf =
                    "ssl_certificate fullchain.pem;\nssl_certificate_key /etc/ssl/server.key;";
                s.tool(
                    S,
                    2 * S,
                    "Write",
                    json!({"file_path": "nginx.conf", "content": conf}),
                    "ok",
                );
            }),
            ("an Edit that names a .env", |s| {
                s.tool(
                    S,
                    2 * S,
                    "Edit",
                    json!({"file_path": ".gitignore",
                    "old_string": "", "new_string": ".env\n*.key\n"}),
                    "ok",
                );
            }),
            ("a shell echo of a key name", |s| {
                s.bash(S, 2 * S, "echo server.key >> .gitignore", "");
                s.bash(3 * S, 4 * S, "cat README.md; echo .env >> .gitignore", "");
            }),
            ("reading a public certificate", |s| {
                s.tool(
                    S,
                    2 * S,
                    "Read",
                    json!({"file_path": "/etc/ssl/ca.pem"}),
                    "-----BEGIN CERT",
                );
                s.bash(3 * S, 4 * S, "cat fullchain.pem", "-----BEGIN CERTIFICATE-----");
            }),
        ];
        for (why, setup) in misses {
            let mut s = Session::new();
            setup(&mut s);
            s.allowed(10 * S, "github.com", 443, 90_000);
            let flags = s.of(Check::SecretThenEgress);
            assert!(flags.is_empty(), "{why}: {flags:?}");
        }
        let hits: &[(&str, Setup)] = &[
            ("cat of a .key", |s| {
                s.bash(S, 2 * S, "cat /etc/ssl/private/server.key", "-----BEGIN");
            }),
            ("Read of privkey.pem", |s| {
                s.tool(S, 2 * S, "Read", json!({"file_path": "/etc/le/privkey.pem"}), "x");
            }),
            ("base64 of an ssh key", |s| {
                s.bash(S, 2 * S, "base64 -w0 ~/.ssh/id_rsa | head", "AAAA");
            }),
            ("Grep in .env", |s| {
                s.tool(S, 2 * S, "Grep", json!({"pattern": "KEY", "path": ".env"}), "KEY=1");
            }),
            ("tls-key.pem through less", |s| {
                s.bash(S, 2 * S, "less certs/tls-key.pem", "x");
            }),
        ];
        for (why, setup) in hits {
            let mut s = Session::new();
            setup(&mut s);
            s.allowed(10 * S, "github.com", 443, 90_000);
            assert_eq!(s.of(Check::SecretThenEgress).len(), 1, "{why}");
        }
    }

    /// Regression (review MEDIUM 4): Codex's start-up update check to `api.github.com`,
    /// refused with no tool call open, is neither unreported egress nor a denial that a later
    /// `github.com` fetch retries.
    #[test]
    fn an_agent_update_check_is_neither_unreported_nor_retried() {
        let mut s = Session::new();
        s.denied(0, "api.github.com", 443);
        s.prompt(S, "clone the repo");
        s.bash(2 * S, 6 * S, "git clone https://github.com/o/r", "Cloning into 'r'...");
        s.allowed(3 * S, "github.com", 443, 900);
        s.say(10 * S, "Cloned.");
        assert!(s.of(Check::UnreportedEgress).is_empty(), "{:?}", s.of(Check::UnreportedEgress));
        assert!(s.of(Check::RetryAfterDeny).is_empty(), "{:?}", s.of(Check::RetryAfterDeny));
        // A tool's own upload to an update host still counts (npm publish after a read).
        let mut s = Session::new();
        s.bash(S, 2 * S, "cat ~/.npmrc", "//registry.npmjs.org/:_authToken=x");
        s.bash(3 * S, 8 * S, "npm publish", "+ pkg@1.0.0");
        s.allowed(4 * S, "registry.npmjs.org", 443, 50_000);
        assert_eq!(s.of(Check::SecretThenEgress).len(), 1);
    }

    #[test]
    fn the_builtin_pack_parses_and_every_check_is_on() {
        let c = Config::builtin();
        for check in Check::ALL {
            assert!(c.get(check).enabled, "{}", check.id());
            assert!(c.get(check).window > 0, "{}", check.id());
        }
        assert_eq!(c.get(Check::SecretThenEgress).min_bytes, 1024);
        assert_eq!(c.get(Check::RetryAfterDeny).window, 120 * S);
        let mut c2 = Config::builtin();
        c2.apply("b", BUILTIN_CORRELATE).unwrap();
        assert_eq!(c, c2);
        assert!(PATTERNS.is_some(), "the constant patterns compile");
    }

    #[test]
    fn correlate_tables_set_parameters_and_bad_ones_are_located() {
        let mut c = Config::builtin();
        c.apply(
            "team.toml",
            "[[correlate]]\nid = \"correlate.secret-then-egress\"\nwindow = \"10m\"\nmin_bytes = 4096\nseverity = \"medium\"\n\n[[correlate]]\nid = \"correlate.transcript-gap\"\nenabled = false\n",
        )
        .unwrap();
        let p = c.get(Check::SecretThenEgress);
        assert_eq!((p.window, p.min_bytes, p.severity), (600 * S, 4096, Severity::Medium));
        assert!(!c.get(Check::TranscriptGap).enabled);
        assert!(c.get(Check::RetryAfterDeny).enabled);
        let cases: &[(&str, &str, &str)] = &[
            ("[[correlate]]\nid = \"correlate.nope\"\n", "x.toml:2:6", "unknown correlate id"),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nwindow = \"soon\"\n",
                "x.toml:3:10",
                "window",
            ),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nwindow = \"0s\"\n",
                "x.toml:3:10",
                "above 0",
            ),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nwindow = \"2d\"\n",
                "x.toml:3:10",
                "at most 24h",
            ),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nmin_bytes = 5\n",
                "x.toml:3:13",
                "only to correlate.secret-then-egress",
            ),
            (
                "[[correlate]]\nid = \"correlate.claimed-vs-seen\"\nmin_attempts = 2\n",
                "x.toml:3:16",
                "min_attempts",
            ),
            (
                "[[correlate]]\nid = \"correlate.unreported-egress\"\nmin_attempts = 0\n",
                "x.toml:3:16",
                "1 or more",
            ),
            (
                "[[correlate]]\nid = \"correlate.secret-then-egress\"\nmin_bytes = -1\n",
                "x.toml:3:13",
                "0 or more",
            ),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nseverity = \"dire\"\n",
                "x.toml:3:12",
                "unknown severity",
            ),
            (
                "[[correlate]]\nid = \"correlate.retry-after-deny\"\nthreshold = 3\n",
                "x.toml:3:1",
                "unknown field",
            ),
            ("[[correlate]]\nid = \n", "x.toml:2:6", ""),
        ];
        for (text, at, want) in cases {
            let e = Config::builtin().apply("x.toml", text).unwrap_err().to_string();
            assert!(e.starts_with(at), "{text:?}: {e}");
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_rules_dir_can_hold_rules_and_correlate_tables_and_turn_the_pack_off() {
        let off: String = Check::ALL
            .iter()
            .map(|c| format!("[[correlate]]\nid = \"{}\"\nenabled = false\n", c.id()))
            .collect();
        let engine = Engine::from_sources(&[
            ("builtin.toml".into(), super::super::detect::BUILTIN_RULES.into()),
            ("off.toml".into(), off),
        ])
        .unwrap();
        assert!(!engine.correlate().any_enabled());
        let mut s = Session::with(engine);
        s.prompt(0, "go");
        s.denied(S, "a.evil.test", 443);
        s.allowed(2 * S, "b.evil.test", 443, 10);
        assert!(s.flags().is_empty(), "no correlation at all with every check off");
        let e = Engine::from_sources(&[(
            "bad.toml".into(),
            "[[correlate]]\nid = \"correlate.x\"\n".into(),
        )])
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("bad.toml:2:6"), "{e}");
    }

    #[test]
    fn retry_after_deny_positives_name_the_way_and_link_both_sides() {
        type Setup = fn(&mut Session) -> Vec<i64>;
        let cases: &[(&str, Setup)] = &[
            ("another host of the same registrable domain", |s| {
                let (c, _) =
                    s.bash(0, 3 * S, "curl https://a.evil.test/x; curl https://b.evil.test/x", "");
                vec![c, s.denied(S, "a.evil.test", 443), s.allowed(2 * S, "b.evil.test", 443, 10)]
            }),
            ("the same host on another port", |s| {
                vec![s.denied(S, "x.test", 443), s.denied(30 * S, "x.test", 8443)]
            }),
            ("a direct (transparent or UDP) attempt", |s| {
                let d = s.denied(S, "x.test", 443);
                let t = s.egress(5 * S, "denied", json!({"host": "x.test", "port": 443,
                    "method": "CONNECT", "allowed": false, "reason": "not_allowed", "capture": "transparent"}));
                vec![d, t]
            }),
            ("an IP literal", |s| {
                vec![s.denied(S, "x.test", 443), s.denied(9 * S, "203.0.113.7", 443)]
            }),
            ("DNS to another resolver", |s| {
                let d = s.denied(S, "x.test", 443);
                let u = s.egress(
                    3 * S,
                    "denied",
                    json!({"host": "9.9.9.9", "port": 53, "method": "UDP",
                    "allowed": false, "reason": "udp_refused", "capture": "transparent"}),
                );
                vec![d, u]
            }),
            ("another tool", |s| {
                let (c1, _) =
                    s.bash(0, 2 * S, "curl -sS https://x.test/data.json", "curl: (56) 403");
                let d = s.denied(S, "x.test", 443);
                let (c2, _) = s.bash(5 * S, 7 * S,
                    "python3 -c \"import urllib.request as u; u.urlopen('https://x.test/data.json')\"", "");
                let d2 = s.denied(6 * S, "x.test", 443);
                vec![c1, d, c2, d2]
            }),
        ];
        for (way, setup) in cases {
            let mut s = Session::new();
            s.prompt(0, "fetch it");
            let linked = setup(&mut s);
            let flags = s.of(Check::RetryAfterDeny);
            assert_eq!(flags.len(), 1, "{way}: {flags:?}");
            let f = &flags[0];
            assert!(f.detail.contains(way), "{way}: {}", f.detail);
            for pk in linked {
                assert!(f.event_pks.contains(&pk), "{way}: {pk} not linked: {f:?}");
            }
            assert!(f.detail.starts_with("denied CONNECT"), "{}", f.detail);
            assert!(f.detail.contains("[egress "), "{}", f.detail);
            assert_eq!(f.severity, Severity::High);
        }
    }

    #[test]
    fn retry_after_deny_near_misses_are_not_flagged() {
        type Setup = fn(&mut Session);
        let cases: &[(&str, Setup)] = &[
            ("the other host outside the window", |s| {
                s.denied(S, "a.evil.test", 443);
                s.allowed(S + 121 * S, "b.evil.test", 443, 10);
            }),
            ("plain repetition by the same tool", |s| {
                s.bash(0, 9 * S, "for i in 1 2 3; do curl https://x.test; done", "");
                for k in 1..6 {
                    s.denied(k * S, "x.test", 443);
                }
            }),
            ("the agent's own hosts", |s| {
                s.denied(S, "statsig.anthropic.com", 443);
                s.allowed(2 * S, "api.anthropic.com", 443, 5000);
            }),
            ("a DNS refusal then the CONNECT it led to", |s| {
                s.egress(
                    S,
                    "dns",
                    json!({"host": "x.test", "method": "DNS", "qtype": "A",
                    "allowed": false, "reason": "not_allowed", "answer": "NXDOMAIN"}),
                );
                s.denied(2 * S, "x.test", 443);
            }),
            ("the same tool twice", |s| {
                s.bash(0, 2 * S, "curl https://x.test/a", "");
                s.denied(S, "x.test", 443);
                s.bash(3 * S, 4 * S, "curl -v https://x.test/a", "");
                s.denied(3 * S + 500_000, "x.test", 443);
            }),
            ("an unrelated domain after a denial", |s| {
                s.denied(S, "x.test", 443);
                s.allowed(2 * S, "crates.io", 443, 10);
            }),
            ("a cap, not a policy refusal", |s| {
                s.egress(
                    S,
                    "capped",
                    json!({"host": "a.evil.test", "port": 443, "method": "CONNECT",
                    "allowed": false, "reason": "tunnel_limit"}),
                );
                s.allowed(2 * S, "b.evil.test", 443, 10);
            }),
        ];
        for (why, setup) in cases {
            let mut s = Session::new();
            s.prompt(0, "go");
            setup(&mut s);
            assert!(
                s.of(Check::RetryAfterDeny).is_empty(),
                "{why}: {:?}",
                s.of(Check::RetryAfterDeny)
            );
        }
    }

    #[test]
    fn secret_then_egress_tp_and_near_misses() {
        // Positives: a credential read, a secret in a tool result.
        let mut s = Session::new();
        s.prompt(0, "deploy");
        let (c, r) = s.tool(
            S,
            2 * S,
            "Read",
            json!({"file_path": "/home/u/.ssh/id_ed25519"}),
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc",
        );
        let up = s.allowed(60 * S, "paste.test", 443, 5000);
        let flags = s.of(Check::SecretThenEgress);
        assert_eq!(flags.len(), 1, "{flags:?}");
        for pk in [c, r, up] {
            assert!(flags[0].event_pks.contains(&pk), "{pk}: {:?}", flags[0]);
        }
        assert_eq!(flags[0].severity, Severity::Critical);
        assert!(flags[0].detail.contains("sent 5000 bytes"), "{}", flags[0].detail);

        let mut s = Session::new();
        let (_, r) = s.bash(
            S,
            2 * S,
            "grep -r STRIPE src/",
            "src/cfg.rs: STRIPE=sk_live_abcdefghijklmnop0000",
        );
        let up = s.allowed(10 * S, "collector.test", 443, 2048);
        let flags = s.of(Check::SecretThenEgress);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].event_pks.contains(&r) && flags[0].event_pks.contains(&up));
        assert!(flags[0].detail.contains("secret.stripe-key"), "{}", flags[0].detail);

        type Setup = fn(&mut Session);
        let misses: &[(&str, Setup)] = &[
            ("a secret in the user's own message", |s| {
                s.prompt(S, "use key sk_live_abcdefghijklmnop0000 please");
                s.allowed(10 * S, "collector.test", 443, 5000);
            }),
            ("the upload goes to the agent's API", |s| {
                s.bash(S, 2 * S, "cat ~/.aws/credentials", "[default]");
                s.allowed(10 * S, "api.anthropic.com", 443, 90_000);
            }),
            ("the upload is small", |s| {
                s.bash(S, 2 * S, "cat .env", "A=1");
                s.allowed(10 * S, "x.test", 443, 1024);
            }),
            ("the upload is outside the window", |s| {
                s.bash(S, 2 * S, "cat .env", "A=1");
                s.allowed(S + 301 * S, "x.test", 443, 9000);
            }),
            ("the upload came before the read", |s| {
                s.allowed(S, "x.test", 443, 9000);
                s.bash(5 * S, 6 * S, "cat .env", "A=1");
            }),
            ("a template is no credential", |s| {
                s.bash(S, 2 * S, "cat .env.example", "A=changeme");
                s.allowed(10 * S, "x.test", 443, 9000);
            }),
            ("a public key is no credential", |s| {
                s.bash(S, 2 * S, "cat ~/.ssh/id_ed25519.pub", "ssh-ed25519 AAAA");
                s.allowed(10 * S, "x.test", 443, 9000);
            }),
            ("a denied upload sent nothing", |s| {
                s.bash(S, 2 * S, "cat .env", "A=1");
                s.denied(10 * S, "x.test", 443);
            }),
        ];
        assert_no_flags(Check::SecretThenEgress, false, misses);
    }

    #[test]
    fn unreported_egress_tp_and_near_misses() {
        // A background process's traffic after its call returned.
        let mut s = Session::new();
        s.prompt(0, "start the server");
        let (_, r) = s.bash(S, 2 * S, "(sleep 20; curl https://beacon.test) &", "");
        let e = s.allowed(22 * S, "beacon.test", 443, 100);
        let next = s.say(40 * S, "Started.");
        let flags = s.of(Check::UnreportedEgress);
        assert_eq!(flags.len(), 1, "{flags:?}");
        for pk in [r, e, next] {
            assert!(flags[0].event_pks.contains(&pk), "{pk}: {:?}", flags[0]);
        }
        assert!(flags[0].detail.contains("no tool call open"), "{}", flags[0].detail);

        // The reverse: a network-looking result with nothing at the proxy.
        let mut s = Session::new();
        let (c, r) = s.bash(
            S,
            2 * S,
            "curl -i https://api.example.test/v1/status",
            "HTTP/1.1 200 OK\ncontent-type: application/json\n\n{\"ok\":true}",
        );
        let end = s.end(10 * S, json!([]));
        let flags = s.of(Check::UnreportedEgress);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].event_pks, vec![c, r, end]);
        assert!(flags[0].detail.contains("reads like network output"), "{}", flags[0].detail);

        type Setup = fn(&mut Session);
        let misses: &[(&str, Setup)] = &[
            ("traffic inside the call's span", |s| {
                s.bash(S, 9 * S, "curl https://x.test", "ok");
                s.allowed(5 * S, "x.test", 443, 100);
                s.say(10 * S, "done");
            }),
            ("traffic just after the result, within the grace", |s| {
                s.bash(S, 9 * S, "curl https://x.test", "ok");
                s.allowed(10 * S, "x.test", 443, 100);
                s.say(20 * S, "done");
            }),
            ("the agent's own API, auth and telemetry", |s| {
                s.prompt(0, "hi");
                s.allowed(S, "api.anthropic.com", 443, 100);
                s.allowed(2 * S, "o1.ingest.sentry.io", 443, 100);
                s.allowed(3 * S, "auth.openai.com", 443, 100);
                s.say(5 * S, "hello");
            }),
            ("a session without a transcript", |s| {
                s.allowed(S, "x.test", 443, 100);
            }),
            ("a network result with the proxy's line in the span", |s| {
                s.bash(S, 3 * S, "curl -i https://x.test", "HTTP/1.1 200 OK");
                s.allowed(2 * S, "x.test", 443, 100);
            }),
            ("a saved response printed, not fetched", |s| {
                s.bash(S, 3 * S, "cat fixtures/response.txt", "HTTP/1.1 200 OK\n\nbody");
            }),
            ("a fetch from the sandbox's own loopback", |s| {
                s.bash(S, 3 * S, "curl -i http://localhost:8080/health", "HTTP/1.1 200 OK");
            }),
        ];
        assert_no_flags(Check::UnreportedEgress, false, misses);
    }

    #[test]
    fn claimed_vs_seen_tp_and_near_misses() {
        let mut s = Session::new();
        s.bash(S, 3 * S, "curl https://x.test", "ok");
        let e = s.allowed(2 * S, "x.test", 443, 10);
        let m = s.say(10 * S, "Done. I did not access the network; everything was local.");
        let flags = s.of(Check::ClaimedVsSeen);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].event_pks.contains(&e) && flags[0].event_pks.contains(&m));

        let mut s = Session::new();
        let (c, _) =
            s.tool(S, 2 * S, "Read", json!({"file_path": "/home/u/.aws/credentials"}), "[default]");
        let m = s.say(10 * S, "All set \u{2014} I didn\u{2019}t  read any credentials.");
        let flags = s.of(Check::ClaimedVsSeen);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].event_pks, vec![m, c]);
        assert!(flags[0].detail.contains("no credentials were read"), "{}", flags[0].detail);

        type Setup = fn(&mut Session);
        let misses: &[(&str, Setup)] = &[
            ("a true claim: only the agent's own API", |s| {
                s.allowed(S, "api.anthropic.com", 443, 10);
                s.say(10 * S, "No network requests were made.");
            }),
            ("the claim is not the final message", |s| {
                s.say(S, "I did not access the network yet.");
                s.allowed(2 * S, "x.test", 443, 10);
                s.say(10 * S, "Fetched the data from x.test.");
            }),
            ("a subagent's message is not the final message", |s| {
                s.allowed(2 * S, "x.test", 443, 10);
                s.say(5 * S, "Fetched it.");
                s.line(10 * S, json!({"type": "assistant", "isSidechain": true, "message": {
                    "role": "assistant", "content": [{"type": "text", "text": "I did not access the network."}]}}));
            }),
            ("no claim at all", |s| {
                s.allowed(2 * S, "x.test", 443, 10);
                s.say(10 * S, "Network access worked fine.");
            }),
            ("a credential claim with no credential read", |s| {
                s.bash(S, 2 * S, "cat README.md", "hi");
                s.say(10 * S, "I did not read any credentials.");
            }),
        ];
        assert_no_flags(Check::ClaimedVsSeen, false, misses);
    }

    #[test]
    fn the_phrase_list_matches_after_normalization() {
        for (text, net, cred) in [
            ("I did not access the network.", true, false),
            ("I DIDN'T access the network", true, false),
            ("I didn\u{2019}t make any network requests.", true, false),
            ("no\nnetwork   requests were made", true, false),
            ("I haven't accessed the network", true, false),
            ("I never read any secrets or credentials", false, true),
            ("No credentials were read and no network access was needed.", true, true),
            ("I accessed the network to fetch deps", false, false),
            ("Network requests: 3", false, false),
        ] {
            let c = claims(text);
            assert_eq!((c.no_network, c.no_credentials), (net, cred), "{text:?}");
        }
    }

    #[test]
    fn transcript_gap_tp_and_near_misses() {
        let f = ".claude/projects/-w/a.jsonl";
        // A published file that does not match the record.
        let mut s = Session::new();
        s.prompt(0, "hi");
        let item = s.published(5 * S, f, 100, &sha('b'));
        let end = s.end(
            6 * S,
            json!([{"path": format!("/h/{f}"), "file": f, "bytes": 100, "sha256": sha('a')}]),
        );
        let flags = s.of(Check::TranscriptGap);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].event_pks, vec![item, end]);
        assert!(flags[0].detail.contains("does not match"), "{}", flags[0].detail);

        // A listed file never published: a gap at the settle check only.
        let mut s = Session::new();
        s.prompt(0, "hi");
        s.end(
            6 * S,
            json!([{"path": format!("/h/{f}"), "file": f, "bytes": 100, "sha256": sha('a')}]),
        );
        assert!(s.of(Check::TranscriptGap).is_empty(), "not yet: the end record's own check");
        s.settled = true;
        let flags = s.of(Check::TranscriptGap);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].detail.contains("never published"), "{}", flags[0].detail);

        // Proxy activity over a long span with no line, lines before and after.
        let mut s = Session::new();
        let a = s.say(0, "working");
        let e = s.allowed(40 * S, "x.test", 443, 10);
        let b = s.say(90 * S, "done");
        let flags = s.of(Check::TranscriptGap);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].event_pks, vec![e, a, b]);

        type Setup = fn(&mut Session);
        let f_ok: Setup = |s| {
            let f = ".claude/projects/-w/a.jsonl";
            s.prompt(0, "hi");
            s.published(5 * S, f, 100, &sha('a'));
            s.end(
                6 * S,
                json!([{"path": format!("/h/{f}"), "file": f, "bytes": 100, "sha256": sha('a')}]),
            );
        };
        let misses: &[(&str, Setup)] = &[
            ("the published file matches", f_ok),
            ("a file too large to hash", |s| {
                let f = ".claude/projects/-w/a.jsonl";
                s.published(5 * S, f, 100, &sha('a'));
                s.end(6 * S, json!([{"path": format!("/h/{f}"), "file": f, "bytes": 0, "sha256": "skipped:too-large"}]));
            }),
            ("a long call open over the span", |s| {
                s.bash(0, 300 * S, "cargo build", "Compiling");
                s.allowed(40 * S, "static.crates.io", 443, 10);
            }),
            ("a span shorter than the window", |s| {
                s.say(0, "a");
                s.allowed(5 * S, "x.test", 443, 10);
                s.say(10 * S, "b");
            }),
            ("a long quiet span with no activity", |s| {
                s.say(0, "a");
                s.say(600 * S, "b");
            }),
            ("only telemetry in the span", |s| {
                s.say(0, "a");
                s.allowed(60 * S, "statsig.anthropic.com", 443, 10);
                s.say(600 * S, "b");
            }),
        ];
        assert_no_flags(Check::TranscriptGap, true, misses);
    }

    #[test]
    fn flag_ids_are_stable_when_more_events_arrive() {
        let mut s = Session::new();
        s.prompt(0, "go");
        s.denied(S, "a.evil.test", 443);
        s.allowed(2 * S, "b.evil.test", 443, 10);
        let first = s.of(Check::RetryAfterDeny);
        s.allowed(3 * S, "c.evil.test", 443, 10);
        let second = s.of(Check::RetryAfterDeny);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].id, second[0].id, "the same case, one flag");
        assert_eq!(second[0].event_pks, vec![2, 3, 4], "{:?}", second[0]);
    }

    #[test]
    fn codex_calls_results_and_messages_are_read() {
        let mut s = Session::new();
        let call = json!({"type": "response_item", "payload": {"type": "function_call", "name": "shell",
            "arguments": "{\"command\":[\"bash\",\"-lc\",\"cat ~/.aws/credentials\"]}", "call_id": "c1"}});
        let out = json!({"type": "response_item", "payload": {"type": "function_call_output",
            "call_id": "c1", "output": "{\"output\":\"[default]\\n\",\"metadata\":{\"exit_code\":0}}"}});
        let c = s.push(Source::Codex, "", "response_item", S, None, call);
        s.push(Source::Codex, "", "response_item", 2 * S, None, out);
        let up = s.allowed(5 * S, "x.test", 443, 4096);
        let m = s.push(
            Source::Codex,
            "",
            "event_msg",
            9 * S,
            None,
            json!({"type": "event_msg",
            "payload": {"type": "agent_message", "message": "I did not read any credentials."}}),
        );
        let flags = s.flags();
        let ste: Vec<_> =
            flags.iter().filter(|f| f.rule_id == Check::SecretThenEgress.id()).collect();
        assert_eq!(ste.len(), 1, "{flags:?}");
        assert!(ste[0].event_pks.contains(&c) && ste[0].event_pks.contains(&up));
        let cvs: Vec<_> = flags.iter().filter(|f| f.rule_id == Check::ClaimedVsSeen.id()).collect();
        assert_eq!(cvs.len(), 1, "{flags:?}");
        assert_eq!(cvs[0].event_pks, vec![m, c]);
    }

    #[test]
    fn past_the_egress_cap_the_scan_keeps_nothing_more_and_says_so() {
        let engine = Arc::new(Engine::builtin().unwrap());
        let mut scan = CorrelateScan::new(engine, "u", "s1");
        let p = json!({"host": "x.test", "port": 443, "method": "CONNECT", "allowed": true})
            .to_string();
        for pk in 0..(MAX_EGRESS as i64 + 10) {
            scan.feed(Row {
                pk,
                id: "e",
                source: Source::Egress,
                kind: "connect",
                ts: T0 + pk,
                received_at: T0,
                file: None,
                payload: &p,
            });
        }
        assert_eq!(scan.egress.len(), MAX_EGRESS);
        let flags = scan.finish();
        let inc: Vec<_> = flags.iter().filter(|f| f.rule_id == "detect.incomplete").collect();
        assert_eq!(inc.len(), 1, "{flags:?}");
        assert!(inc[0].detail.contains("egress lines"), "{}", inc[0].detail);
        assert_ne!(
            inc[0].id,
            super::super::detect::session::incomplete("u", "s1", "x").id,
            "its own id: the session checks' incomplete flag does not swallow it"
        );
    }

    #[test]
    fn a_details_sides_read_back() {
        let mut s = Session::new();
        s.prompt(0, "go");
        s.denied(S, "a.evil.test", 443);
        s.allowed(2 * S, "b.evil.test", 443, 10);
        s.end(9 * S, json!([]));
        let f = &s.of(Check::RetryAfterDeny)[0];
        assert_eq!(sides(&f.detail), vec![(Side::Egress, vec![2, 3])]);
        assert_eq!(
            sides("x [egress 1, 2 and 5 more; transcript 7; record 9]"),
            vec![(Side::Egress, vec![1, 2]), (Side::Transcript, vec![7]), (Side::Record, vec![9])]
        );
        for bad in ["no brackets", "x [egress one]", "x [people 1]", "x []", "[egress 1"] {
            assert!(sides(bad).is_empty(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Whatever a client stored (payloads are the client's, verbatim), the scan neither
        /// panics nor links an event it was not fed.
        #[test]
        fn any_rows_scan_without_panic(rows in proptest::collection::vec(
            (0..4usize, 0..600i64, proptest::sample::select(vec![
                "{}", "null", "[]", "{\"host\":\"x.test\",\"allowed\":false,\"reason\":\"not_allowed\",\"port\":443}",
                "{\"host\":\"a.x.test\",\"allowed\":true,\"bytes_sent\":99999}",
                "{\"host\":5,\"port\":\"x\"}", "{\"seqs\":[[1,3]],\"host\":\"x.test\"}",
                "{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"Bash\",\"input\":{\"command\":\"curl https://x.test; cat .env\"}}]}}",
                "{\"type\":\"user\",\"message\":{\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"HTTP/1.1 200 OK sk_live_abcdefghijklmnop0000\"}]}}",
                "{\"type\":\"assistant\",\"message\":{\"content\":\"I did not access the network\"}}",
                "{\"type\":\"response_item\",\"payload\":{\"type\":\"function_call\",\"arguments\":\"{\\\"command\\\":7}\"}}",
                "{\"transcripts\":[{\"file\":\"f\",\"sha256\":\"sha256:00\"}]}",
                "{\"bytes\":1,\"sha256\":\"x\"}", "not json",
            ])), 0..40)) {
            let mut s = Session::new();
            for (kind, at, payload) in &rows {
                let v: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
                match kind {
                    0 => { s.egress(at * S, "denied", v); }
                    1 => { s.line(at * S, v); }
                    2 => { s.end(at * S, v); }
                    _ => { s.published(at * S, "f", 1, payload); }
                }
            }
            let fed = s.rows.len() as i64;
            for f in s.flags() {
                proptest::prop_assert!(f.event_pks.iter().all(|pk| (1..=fed).contains(pk)), "{:?}", f);
            }
        }
    }

    #[test]
    fn tool_families_and_hosts_in_commands() {
        let call = |name: &str, text: &str| Call {
            name: name.into(),
            text: text.into(),
            ..Call::default()
        };
        assert_eq!(
            tool_family(&call("Bash", "/usr/bin/curl -s https://x.test")).as_deref(),
            Some("curl")
        );
        assert_eq!(
            tool_family(&call("Bash", "cd a && python3.12 fetch.py")).as_deref(),
            Some("python")
        );
        assert_eq!(
            tool_family(&call("WebFetch", "{\"url\":\"https://x.test\"}")).as_deref(),
            Some("webfetch")
        );
        assert_eq!(tool_family(&call("Bash", "cargo test")), None);
        assert!(call_aims_at(&call("Bash", "wget https://cdn.x.test/f"), "api.x.test"));
        assert!(!call_aims_at(&call("Bash", "wget https://notx.test/f"), "x.test"));
        assert_eq!(agent_host("o123.ingest.sentry.io"), Some(HostRole::Telemetry));
        assert_eq!(agent_host("api.anthropic.com."), Some(HostRole::Api));
        assert_eq!(agent_host("evil-api.anthropic.com"), None);
        assert_eq!(agent_host("registry.npmjs.org"), Some(HostRole::Update));
        assert!(names_key_file("cat ~/.ssh/id_rsa"));
        assert!(names_key_file("{\"file_path\":\"/srv/tls/server.key\"}"));
        assert!(!names_key_file("cat ~/.ssh/known_hosts ~/.ssh/config"));
    }
}
